"""The HTML report's precision section (``html.py``): from ``report.precision``, the policy,
nodes per dtype, casts, the heavy ops kept in fp32 with the reason and a per-node table in
collapsible groups (int8 / bf16 / fp16 / fp32 per node and why), then the int8 quantisation and
the ``precision="auto"`` search (``precision_int8.py``); the outputs' error against the fp32 graph unoptimised (O0), and a
``compare_precision.PrecisionComparison``'s accuracy when given."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from .precision_int8 import int8_part
from .parts import GROUP_CHUNK, escape, group_items, html_figure, html_table, op_label, scope_of, table_row


def precision_section(model, accuracy: list[list[Any]] | None, comparison: Any = None) -> str:
    """The policy, nodes by dtype, casts, the heavy ops kept in fp32 (why), and a per-node table
    (node, op, dtype, why) in collapsible groups with a search box, from ``report.precision``;
    a plain fp32 compile shows the output dtypes per op. Then the accuracy tables given."""
    prec = model.report.precision
    parts = ['<section id="precision"><h2>Precision</h2>']
    if not prec:
        by_op: dict[str, Counter] = defaultdict(Counter)
        for n in model.graph.nodes:
            for o in n.outputs:
                by_op[op_label(n)][o.dtype.name if hasattr(o.dtype, "name") else str(o.dtype)] += 1
        rows = [[op, ", ".join(f"{d} x{c}" for d, c in cnt.most_common())] for op, cnt in sorted(by_op.items())]
        parts += [(f"<p>precision: {escape(model.config.precision)}: every op computes in float32 (compile with "
                   f"Config(precision=&quot;bf16&quot;) for mixed precision); output dtypes per op:</p>"),
                  html_table(["op", "output dtypes"], rows)]
    else:
        by_dtype, kept, logits = prec["by_dtype"], prec["kept_fp32"], prec["fp32_logits"]
        nodes, overrides = prec["nodes"], prec["op_precision"]
        parts.append('<div class="figs">')
        parts.append(html_figure("policy", prec["policy"], "precision_policy", prec["policy"]))
        for dtype, count in sorted(by_dtype.items(), key=lambda kv: -kv[1]):
            parts.append(html_figure(f"nodes in {dtype}", str(count), f"precision_nodes_{dtype}", count))
        parts.append(html_figure("precision casts", str(prec["casts"]), "precision_casts", prec["casts"]))
        parts.append(html_figure("heavy ops kept in fp32", str(len(kept)), "precision_kept_fp32", len(kept)))
        parts.append(html_figure("logits written in fp32", str(len(logits)), "precision_fp32_logits", len(logits)))
        parts.append("</div>")
        if overrides:
            parts.append("<p>op_precision: " + escape(", ".join(f"{k}={v}" for k, v in overrides.items())) + "</p>")
        declined = prec.get("auto", {}).get("declined")
        if declined:
            parts.append(f"<p>auto chose fp32: {escape(declined)}</p>")
        parts.append(f'<details class="group"{" open" if kept else ""}><summary>heavy ops kept in fp32, with '
                     f"the reason ({len(kept)})</summary>"
                     + html_table(["node", "op", "why"], [[k["node"], k["op"], k["why"]] for k in kept]) + "</details>")
        if logits:
            parts.append(f'<details class="group"><summary>logits written in fp32 from reduced operands '
                         f"({len(logits)})</summary>"
                         + html_table(["node", "op", "why"], [[k["node"], k["op"], k["why"]] for k in logits])
                         + "</details>")
        head = "".join(f"<th>{escape(h)}</th>" for h in ["node", "op", "dtype", "class", "why"])
        items = [(scope_of(r["node"]),
                  table_row(f"{r['node']} {r['op']} {r['dtype']}",
                            [escape(r["node"]), escape(r["op"]), escape(r["dtype"]), escape(r["class"]), escape(r["why"])],
                            "reduced" if r["dtype"] != "fp32" else ""))
                 for r in nodes]
        groups = group_items(items)
        small = len(nodes) <= GROUP_CHUNK
        parts.append(f'<div id="precision-nodes"><h3>Per node: {len(nodes)} float nodes</h3>'
                     f'<input class="search" type="search" placeholder="search by node name, op or dtype" '
                     f'data-target="precision-nodes" oninput="fgSearch(this)"> '
                     f'<button onclick="fgToggle(\'precision-nodes\', true)">expand all</button> '
                     f'<button onclick="fgToggle(\'precision-nodes\', false)">collapse all</button> '
                     f'<span class="hits muted"></span>'
                     + "".join(f'<details class="group"{" open" if small else ""}><summary>{escape(t)}</summary>'
                               f'<table class="precision-nodes"><tr>{head}</tr>{"".join(rows)}</table></details>'
                               for t, rows in groups) + "</div>")
        parts.append(int8_part(prec))
    if accuracy:
        parts.append("<p>outputs against the fp32 graph unoptimised (O0), same inputs:</p>"
                     + html_table(["output", "shape", "rel L2 error", "max abs error", "cosine", "top-1 agrees"],
                              accuracy, {2, 3, 4}))
    if comparison is not None:
        parts.append(_comparison_table(comparison))
    return "".join(parts) + "</section>"


def _num(v: Any, fmt: str = ".3g") -> str:
    return "—" if v is None else format(v, fmt)


def _comparison_table(result: Any) -> str:
    """A ``compare_precision.PrecisionComparison``'s accuracy (per output, both sides against the reference)."""
    p = result.precision
    rows = []
    for name, sides in result.accuracy.items():
        f, r, rv = (sides.get(k, {}) for k in ("fp32", "reduced", "reduced_vs_fp32"))
        top1 = [x.get("top1_agree") for x in (f, r, rv)]
        rows.append([name, _num(f.get("rel_l2")), _num(r.get("rel_l2")), _num(rv.get("rel_l2")),
                     _num(r.get("max_abs")), _num(r.get("cosine"), ".6f"),
                     " / ".join("—" if t is None else f"{100 * t:.1f}%" for t in top1)])
    return (f"<p>fp32 and {escape(p)} against {escape(result.reference)}, {escape(result.inputs)} random input(s):</p>"
            + html_table(["output", "rel L2 fp32 vs ref", f"rel L2 {p} vs ref", f"rel L2 {p} vs fp32",
                      f"max abs {p} vs ref", f"cosine {p} vs ref", "top-1 agreement (fp32 / reduced / vs fp32)"],
                     rows, {1, 2, 3, 4, 5}))


def precision_figures(prec) -> dict[str, Any] | None:
    if not prec:
        return None
    figs = {"policy": prec["policy"], "by_dtype": dict(prec["by_dtype"]), "casts": prec["casts"],
            "kept_fp32": len(prec["kept_fp32"]), "fp32_logits": len(prec["fp32_logits"]), "nodes": len(prec["nodes"]),
            "op_precision": dict(prec["op_precision"])}
    if prec.get("int8"):
        figs["int8_products"] = prec["int8"].get("products_int8")
    if (prec.get("auto") or {}).get("chosen"):
        figs["auto_chose"] = prec["auto"]["chosen"]
    return figs
