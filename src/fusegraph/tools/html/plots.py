"""The figures of the HTML report, drawn by matplotlib as inline SVG text.

- ``memory_svg``: the memory plan's timeline (``tools/memory_plot.plot_memory_timeline``:
  arena offset x step, one rectangle per buffer span, arena and lower bound lines);
- ``gantt_svg``: per-stream bars of the measured run (the profiler's kernel starts and
  durations) above the stream planner's estimate (``StreamPlan.start`` / ``cost``);
- ``ops_svg``: time by op type, horizontal bars.

SVG comes back without its XML prologue, DOCTYPE, metadata and namespace declarations (an
``<svg>`` inside HTML needs none), so the page names no external URL. Text stays text
(``svg.fonttype = none``). matplotlib is imported only here.
"""
from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path


def _clean(svg: str) -> str:
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    return svg


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def _rc():
    return {"svg.fonttype": "none", "svg.hashsalt": "fusegraph", "font.size": 8}


def _fig_svg(fig) -> str:
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return _clean(buf.getvalue())


def memory_svg(mem) -> str:
    from ..memory_plot import plot_memory_timeline
    plt = _plt()
    with plt.rc_context(_rc()), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.svg"
        plot_memory_timeline(mem, path)
        return _clean(path.read_text())


def gantt_svg(profile, streams=None) -> str:
    """Measured per-stream bars (``profile.kernels``) and, when a stream plan is given, the
    planner's estimated bars below them, on the same kind of axes (µs)."""
    plt = _plt()
    with plt.rc_context(_rc()):
        rows = 2 if streams is not None and streams.start else 1
        n = max(profile.streams, streams.num_streams if streams is not None else 1)
        fig, axes = plt.subplots(rows, 1, figsize=(11, 1.2 + 0.6 * n * rows), squeeze=False)
        cmap = plt.get_cmap("tab20")
        ops = sorted({k.op for k in profile.kernels})
        color = {op: cmap(i % 20) for i, op in enumerate(ops)}
        ax = axes[0][0]
        for k in profile.kernels:
            ax.broken_barh([(k.start_us, max(k.dur_us, 0.01))], (k.stream - 0.4, 0.8),
                           facecolors=color[k.op], edgecolor="black", linewidth=0.2)
        ax.set_title(f"measured run (timing hook, per-node kernels): {profile.hooked_ms:.3f} ms")
        _stream_axis(ax, n)
        if rows == 2:
            ax = axes[1][0]
            op_of = {k.name: k.op for k in profile.kernels}
            for name, start in streams.start.items():
                cost = streams.cost.get(name, 0.0)
                ax.broken_barh([(start, max(cost, 0.01))], (streams.stream_of.get(name, 0) - 0.4, 0.8),
                               facecolors=color.get(op_of.get(name, ""), "lightgray"), edgecolor="black",
                               linewidth=0.2)
            ax.set_title(f"planner's estimate ({streams.algorithm}): {streams.estimated_time / 1000:.3f} ms")
            _stream_axis(ax, n)
        from matplotlib.patches import Patch
        busiest = [op for op, _, _ in profile.by_op()[:12]]
        axes[0][0].legend(handles=[Patch(facecolor=color[op], label=op) for op in busiest], fontsize=6,
                          loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        axes[-1][0].set_xlabel("µs from the run's start")
        fig.tight_layout()
        return _fig_svg(fig)


def _stream_axis(ax, n: int) -> None:
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"stream {s}" for s in range(n)])
    ax.set_ylim(n - 0.5, -0.5)


def ops_svg(profile, top: int = 20) -> str:
    plt = _plt()
    rows = profile.by_op()[:top]
    with plt.rc_context(_rc()):
        fig, ax = plt.subplots(figsize=(8, 0.8 + 0.28 * max(len(rows), 1)))
        ax.barh([op for op, _, _ in rows], [us for _, _, us in rows], color="#4c78a8")
        ax.invert_yaxis()
        ax.set_xlabel("µs per run (sum of per-node medians)")
        ax.set_title("time by op type")
        fig.tight_layout()
        return _fig_svg(fig)
