"""The memory plan's timeline as a picture (``fusegraph inspect MODEL --memory-plot out.png``,
the HTML report's memory figure): steps across, offsets up, one rectangle per buffer span, the
arena and the lower bound as lines. matplotlib is imported only when a plot is drawn.
"""
from __future__ import annotations

from ..report.memory import MemoryReport


def plot_memory_timeline(report: MemoryReport, path, *, title: str | None = None,
                         max_labels: int = 40) -> None:
    """Draw the plan: steps across, offsets up, one rectangle per buffer span; save to ``path``."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    mib = float(1 << 20)
    fig, ax = plt.subplots(figsize=(12, 6))
    cmap = plt.get_cmap("tab20")
    largest = sorted(report.buffers, key=lambda b: -b["size"])[:max_labels]
    labelled = {b["name"] for b in largest}
    for k, b in enumerate(report.buffers):
        for s, e in b["spans"]:
            ax.add_patch(Rectangle((s, b["offset"] / mib), e - s + 1, b["size"] / mib, linewidth=0.3,
                                   edgecolor="black", facecolor=cmap(k % 20), alpha=0.8))
        if b["name"] in labelled and b["size"] / mib > report.arena_bytes / mib / 40:
            s, e = b["spans"][0]
            ax.text(s + 0.1, (b["offset"] + b["size"] / 2) / mib, b["name"][:24], fontsize=5, va="center")
    ax.axhline(report.arena_bytes / mib, color="red", linewidth=1, label="arena")
    ax.axhline(report.lower_bound_bytes / mib, color="green", linestyle="--", linewidth=1,
               label="lower bound")
    ax.set_xlim(0, max(report.steps, 1))
    ax.set_ylim(0, max(report.arena_bytes / mib * 1.05, 1e-6))
    ax.set_xlabel("step")
    ax.set_ylabel("offset (MiB)")
    ax.set_title(title or f"memory plan ({report.mode}, {report.order}, {report.algorithm}): "
                          f"arena {report.arena_bytes / mib:.2f} MiB, lower bound "
                          f"{report.lower_bound_bytes / mib:.2f} MiB")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
