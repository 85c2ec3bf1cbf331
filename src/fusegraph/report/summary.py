"""Short readable renderings of a ``CompileReport``: ``str(model.report)`` (``report_text``), the
rich table a ``rich`` console prints for it (``report_table``), and the one-line precision
summary the ``fusegraph`` command prints (``precision_text``).

A few lines, not the record's every field: the model, nodes imported and after the passes,
fusions, kernels per run and their implementations, the arena beside its lower bound, streams,
the precision policy and the timings. Names from the model are escaped (``printable``).
"""
from __future__ import annotations

from typing import Any

from .printable import printable

_MIB = float(1 << 20)
_TIMINGS = ("import", "infer", "quantise", "passes", "plan", "bind", "load")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def precision_text(prec: Any) -> str | None:
    """One line about ``report.precision`` (None for a plain fp32 compile)."""
    if not prec:
        return None
    counts = ", ".join(f"{n} {printable(d)}" for d, n in sorted(prec["by_dtype"].items(), key=lambda kv: -kv[1]))
    line = (f"precision: {printable(prec['policy'])} policy: nodes {counts or 'no float nodes'}; "
            f"{prec['casts']} cast(s)")
    if prec["casts_folded"]:
        line += f" ({prec['casts_folded']} more folded into their producers)"
    if prec["op_precision"]:
        line += "; op_precision " + ", ".join(f"{printable(k)}={printable(v)}" for k, v in prec["op_precision"].items())
    kept = prec["kept_fp32"]
    if kept:
        line += (f"; {len(kept)} heavy op(s) kept in fp32 (first: {printable(kept[0]['node'])} "
                 f"({printable(kept[0]['op'])}): {printable(kept[0]['why'])})")
    logits = prec["fp32_logits"]
    if logits:
        line += (f"; {len(logits)} logits product(s) write fp32 from {printable(prec['policy'])} operands "
                 f"(first: {printable(logits[0]['node'])} ({printable(logits[0]['op'])}))")
    if prec["op_precision_unmatched"]:
        line += ("; op_precision entries that changed nothing (no run-time node): "
                 + ", ".join(printable(k) for k in prec["op_precision_unmatched"]))
    int8 = prec.get("int8")
    if int8:
        how = (f"calibrated ({printable(str(int8['calibration']))}) on {int8['calibration_inputs']} input(s), "
               f"{len(int8['activations'])} activation(s) quantised" if int8["mode"] == "static"
               else "activations quantised at run time (dynamic)")
        line += f"; int8: {int8['products_int8']} product(s), {how}"
    auto = prec.get("auto", {})
    declined = auto.get("declined")
    if declined:
        line += f"; auto chose fp32: {printable(declined)}"
    if auto.get("chosen") == "int8":
        line += (f"; auto chose int8: error {auto['error']:.3g} within budget {auto['budget']:.3g}, "
                 f"{len(auto['kept_fp32'])} product(s) kept fp32 for it")
    elif auto.get("int8", {}).get("why") and "steps" in auto["int8"]:     # searched, then not chosen
        line += f"; auto did not choose int8: {printable(auto['int8']['why'])}"
    return line


def kernels_text(kernels: Any) -> str | None:
    """The backend and how many nodes each implementation runs (the six commonest), and the
    nodes a kernel family declined (``declines_text``; None before binding)."""
    if not kernels:
        return None
    impls = sorted(kernels["implementations"].items(), key=lambda kv: -kv[1])
    line = (f"{printable(kernels['backend'])} backend: "
            + (", ".join(f"{printable(k)} {n}" for k, n in impls[:6]) or "no kernels")
            + (f", {len(impls) - 6} more" if len(impls) > 6 else ""))
    if kernels["declined"]:
        line += "; " + declines_text(kernels["declined"])
    return line


def declines_text(declined: list[dict], ops: int = 3) -> str:
    """How many nodes a kernel family declined (the op's portable kernel, or a slower
    implementation of the family, runs instead), and the first node of each of the first
    ``ops`` ops with its reason."""
    firsts: dict[str, dict] = {}
    for d in declined:
        firsts.setdefault(d["op"], d)
    shown = "; ".join(f"{printable(d['node'])} ({printable(d['op'])}): {printable(d['reason'])}"
                      for d in list(firsts.values())[:ops])
    more = f"; {len(firsts) - ops} more op(s)" if len(firsts) > ops else ""
    return (f"{len(declined)} node(s) declined by a kernel family, their op's portable kernel or a slower "
            f"implementation running instead (first of each op: {shown}{more})")


def _rows(report) -> list[tuple[str, str]]:
    rows = [("model", printable(report.model) or "?"),
            ("nodes", f"{report.nodes_imported} imported -> {report.nodes_final} after {len(report.passes)} pass run(s)")]
    applied = sum(1 for f in report.fusions if f.applied)
    if report.fusions:
        rows.append(("fusions", f"{applied} applied, {len(report.fusions) - applied} declined"))
    kernels = f"{report.kernel_count} per run" + (f" (+{report.shape_kernels} once per input shapes)"
                                                  if report.shape_kernels else "")
    detail = kernels_text(report.kernels)
    rows.append(("kernels", kernels + (f"; {detail}" if detail else "")))
    mem = report.memory
    if mem is not None:
        rows.append(("memory", f"arena {mem.arena_bytes / _MIB:.2f} MiB, lower bound {mem.lower_bound_bytes / _MIB:.2f} "
                               f"MiB (x{mem.ratio_to_lower_bound:.3f}), naive {mem.naive_bytes / _MIB:.2f} MiB "
                               f"[{printable(mem.mode)}]"))
    sp = report.streams
    rows.append(("streams", "1" if sp is None else
                 f"{sp.num_streams} ({len(sp.events)} event(s), {sp.threads_per_stream} thread(s) each; "
                 f"estimated x{sp.estimated_speedup:.2f})"))
    prec = precision_text(report.precision)
    if prec:
        rows.append(("precision", prec.removeprefix("precision: ")))
    t = report.timings
    shown = [f"{k} {_ms(t[k])}" + (f" (verify {_ms(t['verify'])})" if k == "passes" and "verify" in t else "")
             for k in _TIMINGS if k in t]
    if shown:
        rows.append(("timings", ", ".join(shown)))
    return rows


def report_text(report) -> str:
    """``str(model.report)``: one line per row of ``_rows``."""
    rows = _rows(report)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)


def report_repr(report) -> str:
    """``repr(model.report)``: one line (the fields are thousands of records; ``str`` has more)."""
    mem = report.memory
    arena = f", arena {mem.arena_bytes / _MIB:.2f} MiB" if mem is not None else ""
    streams = report.streams.num_streams if report.streams is not None else 1
    return (f"<CompileReport {printable(report.model)!r}: {report.nodes_imported} -> {report.nodes_final} nodes, "
            f"{report.kernel_count} kernels{arena}, {streams} stream(s)>")


def report_table(report):
    """The same rows as a two-column ``rich`` table (values as plain text, never markup)."""
    from rich.table import Table
    from rich.text import Text
    table = Table(title="compile report", show_header=False, box=None, padding=(0, 1))
    table.add_column(style="bold")
    table.add_column()
    for k, v in _rows(report):
        table.add_row(k, Text(v))
    return table
