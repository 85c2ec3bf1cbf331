"""``fusegraph inspect MODEL --html report.html``: one self-contained HTML page about a model.

``render_html(model, feeds, source=None)`` returns the page; ``write_html`` writes it. The page
holds, each in its own ``<section>``: a summary; the graph after optimisation (one row per
kernel in plan order, fused kernels outlined with their rule, the nodes they cover, stream and
measured time) and before it (the source re-imported, when given), both in collapsible groups
(by name scope, or runs of 64 nodes) with a search box; the fusions applied and declined, with
reasons (``report.fusions``); the passes with stats and time (``report.passes``); memory (the
plan's timeline, the lower bound, the order floor, the bytes allocated outside the plan, peak
RSS); streams (a Gantt chart of a measured run beside the planner's estimate); precision (from
``report.precision``: the policy, nodes per dtype, casts, the heavy ops kept in fp32 with the
reason, a per-node table of node, op, dtype and why; the outputs' error against the fp32 graph
unoptimised (O0), and a ``compare_precision.PrecisionComparison``'s accuracy when given); the per-op time
profile (``report.profile``). The figures the page shows are also in a JSON block
(``<script type="application/json" id="fg-figures">``), read from ``model.report``.

No network: style and script are inline (``html_assets.py``), plots are inline SVG drawn by
matplotlib (``html_plots.py``), and no URL appears in the page. The precision section is
``html_precision.py``; tables, figures and groups ``html_parts.py``. Model strings are escaped.
"""
from __future__ import annotations

import json
import resource
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .assets import CSS, JS
from .parts import escape, group_items, html_figure, html_table, mib, op_label, scope_of, table_row
from .precision import precision_figures, precision_section

MAX_DECLINED_ROWS = 2000


def _graph_section(sid: str, title: str, head: list[str], items: list[tuple[str, str]], note: str = "") -> str:
    groups = group_items(items)
    body = "".join(f'<details class="group"{" open" if len(groups) == 1 else ""}><summary>{escape(t)}</summary>'
                   f'<table><tr>{"".join(f"<th>{escape(h)}</th>" for h in head)}</tr>{"".join(rows)}</table>'
                   f"</details>" for t, rows in groups)
    return (f'<section id="{sid}"><h2>{escape(title)}</h2>{note}'
            f'<input class="search" type="search" placeholder="search by node name, op or rule" '
            f'data-target="{sid}" oninput="fgSearch(this)"> '
            f'<button onclick="fgToggle(\'{sid}\', true)">expand all</button> '
            f'<button onclick="fgToggle(\'{sid}\', false)">collapse all</button> <span class="hits muted"></span>'
            f"{body}</section>")


def _covers(report) -> dict[str, list[str]]:
    """Fused node name -> the nodes its fusion replaced (from the fusion records), fused
    nodes among them expanded into theirs."""
    direct: dict[str, list[str]] = {}
    for f in report.fusions:
        if f.applied and f.reason.startswith("-> "):
            direct[f.reason[3:].split(" (")[0]] = list(f.nodes)

    def expand(name: str, seen: frozenset) -> list[str]:   # a fusion of fused nodes covers theirs
        out: list[str] = []
        for x in direct[name]:
            out += expand(x, seen | {x}) if x in direct and x not in seen else [x]
        return out
    return {name: expand(name, frozenset({name})) for name in direct}


def _after_items(model, prof) -> list[tuple[str, str]]:
    nodes = {n.name: n for n in model.graph.nodes}
    order = list(model.plan.order) if model.plan is not None else list(nodes)
    streams = model.plan.streams if model.plan is not None else None
    stream_of = streams.stream_of if streams is not None else {}
    us = {k.name: k.median_us for k in prof.kernels} if prof else {}
    covers = _covers(model.report)
    items = []
    for i, name in enumerate(order):
        n = nodes[name]
        rule = str(n.meta.get("rule", ""))
        inner = covers.get(name, [])
        cov = ("<details><summary>" + escape(f"{len(inner)} nodes") + "</summary><ul class=covers>"
               + "".join(f"<li>{escape(x)}</li>" for x in inner) + "</ul></details>") if inner else ""
        outs = ", ".join(o.type_str() for o in n.outputs)
        cells = [str(i), escape(name), escape(op_label(n)), escape(rule), cov, escape(stream_of.get(name, 0)), f"<code>{escape(outs)}</code>",
                 escape(f"{us[name]:.1f}") if name in us else ""]
        scope = scope_of(inner[0]) if inner else scope_of(name)
        items.append((scope, table_row(" ".join([name, op_label(n), rule] + inner), cells, "fused" if rule else "")))
    return items


def _before_items(graph) -> list[tuple[str, str]]:
    items = []
    for i, n in enumerate(graph.nodes):
        ins = ", ".join("_" if v is None else v.name for v in n.inputs)
        outs = ", ".join(o.type_str() for o in n.outputs)
        cells = [str(i), escape(n.name), escape(op_label(n)), f"<code>{escape(ins)}</code>", f"<code>{escape(outs)}</code>"]
        items.append((scope_of(n.name), table_row(f"{n.name} {op_label(n)}", cells)))
    return items


def _fusions_section(report) -> str:
    applied = [f for f in report.fusions if f.applied]
    declined = [f for f in report.fusions if not f.applied]
    by_rule = Counter(f.rule for f in applied)
    no_by_rule = Counter(f.rule for f in declined)
    rules = sorted(set(by_rule) | set(no_by_rule), key=lambda r: (-by_rule[r], r))
    parts = [f'<section id="fusions"><h2>Fusions: {len(applied)} applied, {len(declined)} declined</h2>',
             html_table(["rule", "applied", "declined"], [[r, by_rule[r], no_by_rule[r]] for r in rules], {1, 2}),
             '<details class="group" open><summary>applied</summary>',
             html_table(["rule", "nodes", "result"], [[f.rule, ", ".join(f.nodes), f.reason] for f in applied]),
             "</details>", '<details class="group"><summary>declined, with the reason</summary>',
             html_table(["rule", "nodes", "reason"], [[f.rule, ", ".join(f.nodes), f.reason]
                                                  for f in declined[:MAX_DECLINED_ROWS]]),
             (f"<p class=muted>{len(declined) - MAX_DECLINED_ROWS} more in model.report.fusions</p>"
              if len(declined) > MAX_DECLINED_ROWS else ""), "</details></section>"]
    return "".join(parts)


def _stat_text(stats: dict) -> str:
    return "; ".join(f"{k}: {v}" for k, v in stats.items() if k not in ("group", "iteration"))


def _passes_section(report) -> str:
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])
    for p in report.passes:
        t = total[p.name]
        t[0] += p.seconds
        t[1] += 1
        t[2] += int(p.changed)
    seconds = sum(p.seconds for p in report.passes)
    rows = [[p.name, p.stats.get("group", ""), p.stats.get("iteration", ""), f"{p.seconds * 1000:.2f}",
             p.nodes_before, p.nodes_after, "yes" if p.changed else "", _stat_text(p.stats)] for p in report.passes]
    agg = [[name, int(t[1]), int(t[2]), f"{t[0] * 1000:.2f}"] for name, t in
           sorted(total.items(), key=lambda kv: -kv[1][0])]
    return (f'<section id="passes"><h2>Passes: {len(report.passes)} runs, {seconds * 1000:.1f} ms</h2>'
            + html_table(["pass", "runs", "changed", "ms"], agg, {1, 2, 3})
            + '<details class="group"><summary>every pass run, in order</summary>'
            + html_table(["pass", "group", "iteration", "ms", "nodes before", "after", "changed", "stats"], rows,
                     {2, 3, 4, 5}) + "</details></section>")


def _memory_section(report, figures: dict) -> str:
    mem = report.memory
    if mem is None:
        return '<section id="memory"><h2>Memory</h2><p>no memory plan (memory off)</p></section>'
    slow = list(mem.not_writable_into_arena)
    parts = ['<section id="memory"><h2>Memory</h2><div class="figs">',
             html_figure("arena (planned)", mib(mem.arena_bytes), "arena_bytes", mem.arena_bytes),
             html_figure("lower bound", mib(mem.lower_bound_bytes), "lower_bound_bytes", mem.lower_bound_bytes),
             html_figure("order floor", mib(mem.order_floor_bytes), "order_floor_bytes", mem.order_floor_bytes),
             html_figure("naive (every tensor its own buffer)", mib(mem.naive_bytes), "naive_bytes", mem.naive_bytes),
             html_figure("allocated outside the plan per run", mib(figures["not_writable_bytes"]), "not_writable_bytes",
                  figures["not_writable_bytes"]),
             html_figure("peak RSS (this process)", mib(figures["peak_rss_bytes"]), "peak_rss_bytes",
                  figures["peak_rss_bytes"]),
             "</div>", f"<p>{escape(mem.summary())}</p>"]
    if mem.buffers:
        from .plots import memory_svg
        parts.append(f'<div class="svg">{memory_svg(mem)}</div>')
    parts.append(f'<details class="group"><summary>not writable into the arena: {len(slow)} nodes</summary>'
                 + html_table(["node", "op", "bytes"], [[d["node"], d["op"], d["bytes"]] for d in slow], {2})
                 + "</details>")
    tensors = [[t.name, t.kind, t.buffer or "", t.offset if t.offset is not None else "",
                t.size if t.size is not None else "", t.first, t.last] for t in mem.tensors]
    parts.append(f'<details class="group"><summary>the plan: {len(tensors)} tensors (offset, size, first and '
                 f'last step)</summary>' + html_table(["tensor", "kind", "buffer", "offset", "size", "first", "last"],
                                                  tensors, {3, 4, 5, 6}) + "</details></section>")
    return "".join(parts)


def _streams_section(model, prof) -> str:
    streams = model.plan.streams if model.plan is not None else None
    parts = ['<section id="streams"><h2>Streams</h2>']
    if streams is None:
        parts.append("<p>one stream: the run has no stream plan (compile with streams &gt; 1 for one); "
                     "the measured run is shown alone.</p>")
    else:
        parts.append(f"<pre class=ir>{escape(streams.to_text().splitlines()[0])}\n"
                     f"{escape(streams.to_text().splitlines()[1])}</pre>")
    if prof is not None:
        from .plots import gantt_svg
        parts.append(f'<div class="svg">{gantt_svg(prof, streams)}</div>')
    return "".join(parts) + "</section>"


def _profile_section(prof) -> str:
    if prof is None:
        return '<section id="profile"><h2>Time profile</h2><p>not measured</p></section>'
    from .plots import ops_svg
    total = sum(k.median_us for k in prof.kernels) or 1.0
    top = [[k.name, k.op, k.stream, f"{k.median_us:.1f}", f"{100 * k.median_us / total:.1f}%"] for k in prof.top(25)]
    ops = [[op, n, f"{us:.1f}", f"{100 * us / total:.1f}%"] for op, n, us in prof.by_op()]
    return (f'<section id="profile"><h2>Time profile</h2><p>median of {prof.runs} runs with the timing hook '
            f"(the same kernels, a timestamp around each): {prof.hooked_ms:.3f} ms; plain run (model.run): "
            f"{prof.plain_ms:.3f} ms.</p><div class=figs><div>"
            + html_table(["kernel", "op", "stream", "µs", "share"], top, {2, 3, 4}) + "</div><div>"
            + html_table(["op", "kernels", "µs", "share"], ops, {1, 2, 3})
            + f'</div></div><div class="svg">{ops_svg(prof)}</div></section>')


def _accuracy(model, feeds, source) -> list[list[Any]] | None:
    """Rows (output, shape, rel L2, max abs, cosine, top-1 agrees) of ``model``'s outputs against
    the fp32 graph unoptimised (O0) on ``feeds`` (``report.accuracy.output_errors``)."""
    if source is None:
        return None
    import numpy as np

    from ...compiler import compile as fg_compile
    from ...config import Config
    from ...compiler.accuracy import output_errors
    ref_model = fg_compile(source, Config(level="O0", memory="off", cpu_kernels="portable",
                                          threads=model.config.threads))
    try:
        ref = {k: np.asarray(v) for k, v in ref_model.run(feeds).items()}
    finally:
        ref_model.close()
    got = {k: np.asarray(v) for k, v in model.run(feeds).items()}
    errors = output_errors(got, ref)
    rows = []
    for name, r in ref.items():
        e = errors.get(name)
        if e is None:
            continue
        same = name in got and got[name].shape == r.shape
        top1 = e.get("top1_agree")
        rows.append([name, str(tuple(r.shape)), f"{e['rel_l2']:.3g}" if same else "shape differs",
                     f"{e['max_abs']:.3g}", f"{e['cosine']:.6f}",
                     "—" if top1 is None else ("yes" if top1 else "no")])
    return rows


def _before_graph(source):
    from ...compiler.driver import import_model
    from ...ops import infer_graph
    graph = import_model(source)
    infer_graph(graph)
    return graph


def figures_of(model, prof=None) -> dict[str, Any]:
    """The figures the page shows, from ``model.report`` (and the profile)."""
    r = model.report
    mem = r.memory
    slow = mem.not_writable_into_arena if mem is not None else []
    streams = model.plan.streams if model.plan is not None else None
    return {"model": model.name, "nodes_imported": r.nodes_imported, "nodes_final": r.nodes_final,
            "kernel_count": r.kernel_count, "shape_kernels": r.shape_kernels,
            "arena_bytes": mem.arena_bytes if mem else 0, "lower_bound_bytes": mem.lower_bound_bytes if mem else 0,
            "order_floor_bytes": mem.order_floor_bytes if mem else None, "naive_bytes": mem.naive_bytes if mem else 0,
            "not_writable_nodes": len(slow), "not_writable_bytes": sum(d["bytes"] for d in slow),
            "fusions_applied": sum(f.applied for f in r.fusions),
            "fusions_declined": sum(not f.applied for f in r.fusions), "pass_runs": len(r.passes),
            "streams": streams.num_streams if streams is not None else 1,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "profiled_kernels": len(prof.kernel_events) if prof else 0,
            "precision": precision_figures(r.precision)}


def render_html(model, feeds: Mapping[str, Any] | None = None, *, source: Any = None, runs: int = 5,
                comparison: Any = None) -> str:
    """The page for ``model``; ``feeds`` (inputs) for the measured run and the accuracy table,
    ``source`` (the model given to ``compile``) for the graph before optimisation,
    ``comparison`` (a ``compare_precision.PrecisionComparison``) for its accuracy table. A model
    with symbolic input dims is shown as its compile at the feeds' shapes, the one its runs
    execute."""
    from ..profile import profile
    if feeds is not None:
        model = model.runs_as(feeds)
    prof = profile(model, feeds, runs=runs) if feeds is not None else None
    figures = figures_of(model, prof)
    before = _before_graph(source) if source is not None else None
    accuracy = _accuracy(model, feeds, source) if source is not None and feeds is not None else None
    r = model.report
    summary = "".join([
        '<section id="summary"><h2>Summary</h2><div class="figs">',
        html_figure("nodes imported", str(r.nodes_imported), "nodes_imported", r.nodes_imported),
        html_figure("nodes after passes", str(r.nodes_final), "nodes_final", r.nodes_final),
        html_figure("kernels per run", str(r.kernel_count), "kernel_count", r.kernel_count),
        html_figure("fusions applied", str(figures["fusions_applied"]), "fusions_applied", figures["fusions_applied"]),
        html_figure("streams", str(figures["streams"]), "streams", figures["streams"]),
        html_figure("arena", mib(figures["arena_bytes"])),
        "</div></section>"])
    after = _graph_section("graph-after", f"Graph after optimisation: {len(model.graph.nodes)} nodes",
                           ["#", "node", "op", "rule", "covers", "stream", "outputs", "µs"],
                           _after_items(model, prof),
                           "<p class=muted>fused kernels are outlined; rows in plan order.</p>")
    if before is not None:
        before_html = _graph_section("graph-before", f"Graph before optimisation: {len(before.nodes)} nodes",
                                     ["#", "node", "op", "inputs", "outputs"], _before_items(before))
    else:
        before_html = ('<section id="graph-before"><h2>Graph before optimisation</h2><p>not available: '
                       "the model was loaded from an artifact (give the source model)</p></section>")
    sections = [summary, after, before_html, _fusions_section(r), _passes_section(r), _memory_section(r, figures),
                _streams_section(model, prof), precision_section(model, accuracy, comparison), _profile_section(prof)]
    nav = "".join(f'<a href="#{s}">{t}</a>' for s, t in [
        ("summary", "summary"), ("graph-after", "graph after"), ("graph-before", "graph before"),
        ("fusions", "fusions"), ("passes", "passes"), ("memory", "memory"), ("streams", "streams"),
        ("precision", "precision"), ("profile", "profile")])
    data = json.dumps(figures).replace("</", "<\\/")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>fusegraph: {escape(model.name)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>fusegraph report: {escape(model.name)}</h1></header><nav>{nav}</nav><main>"
            + "".join(sections)
            + f'</main><script type="application/json" id="fg-figures">{data}</script><script>{JS}</script>'
            "</body></html>\n")


def write_html(model, path: str | Path, *, feeds: Mapping[str, Any] | None = None, source: Any = None,
               runs: int = 5, comparison: Any = None) -> dict[str, Any]:
    """Write ``render_html(...)`` to ``path``; returns its size and node count."""
    if source is None:
        src = str(model.graph.meta.get("source", ""))
        source = src if src.endswith(".onnx") and Path(src).is_file() else None
    page = render_html(model, feeds, source=source, runs=runs, comparison=comparison)
    Path(path).write_text(page, encoding="utf-8")
    return {"bytes": len(page.encode()), "nodes": len(model.graph.nodes)}
