"""``MemoryReport``: what ``report.memory`` shows (pure, JSON-serialisable data), and the
timeline plot behind ``fusegraph inspect MODEL --memory-plot out.png``.

The report puts the planned arena beside the lower bound (max over steps of bytes live at once,
for the chosen order, views and in-place counted), the order floor (what no order's lower bound
can go below; None with lifetime overrides, reuse groups or stream hooks) and the naive sum
(every activation in its own buffer, views included). matplotlib is imported only when a plot
is drawn.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TensorPlan:
    name: str
    buffer: str | None   # the arena buffer it lives in (None: input, constant, unplannable)
    kind: str            # planned | view | inplace | input | const | unplannable
    offset: int | None
    size: int | None
    first: int
    last: int


@dataclass
class MemoryReport:
    mode: str = "balanced"
    arena_bytes: int = 0
    lower_bound_bytes: int = 0
    naive_bytes: int = 0
    algorithm: str = ""
    optimal: bool = False
    order: str = "default"
    steps: int = 0
    alignment: int = 64
    tensors: list[TensorPlan] = field(default_factory=list)
    buffers: list[dict[str, Any]] = field(default_factory=list)   # name, offset, size, spans
    unplannable: list[dict[str, str]] = field(default_factory=list)
    inplace: list[dict[str, str]] = field(default_factory=list)
    algorithms: dict[str, int] = field(default_factory=dict)      # algorithm -> arena bytes
    orders: dict[str, int] = field(default_factory=dict)          # order -> lower bound bytes
    order_floor_bytes: int | None = None  # no execution order's lower bound is below this
    order_floor_node: str | None = None   # the node whose step forces the floor
    warnings: list[str] = field(default_factory=list)
    not_writable_into_arena: list[dict[str, Any]] = field(default_factory=list)  # filled by the runtime
    seconds: float = 0.0

    @property
    def ratio_to_lower_bound(self) -> float:
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    @property
    def naive_over_arena(self) -> float:
        return self.naive_bytes / self.arena_bytes if self.arena_bytes else 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio_to_lower_bound"] = self.ratio_to_lower_bound
        d["naive_over_arena"] = self.naive_over_arena
        return d

    def summary(self) -> str:
        mb = 1 / (1 << 20)
        return (f"memory[{self.mode}, order={self.order}, {self.algorithm}]: arena "
                f"{self.arena_bytes * mb:.2f} MiB, lower bound {self.lower_bound_bytes * mb:.2f} MiB "
                f"(x{self.ratio_to_lower_bound:.3f}), naive {self.naive_bytes * mb:.2f} MiB "
                f"(naive/arena {self.naive_over_arena:.1f}x), {len(self.inplace)} in-place, "
                f"{len(self.unplannable)} unplannable")


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
