"""``MemoryReport``: what ``report.memory`` shows (pure, JSON-serialisable data, the same
record whether the model was compiled or loaded: ``from_dict`` reads a stored one back typed).

The report puts the planned arena beside the lower bound (max over steps of bytes live at once,
for the chosen order, views and in-place counted), the order floor (what no order's lower bound
can go below; None with lifetime overrides, reuse groups or stream hooks) and the naive sum
(every activation in its own buffer, views included). The planner (``plan/memory_plan.py``)
fills it; the timeline plot is ``tools/memory_plot.py``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from .typed_json import typed


@dataclass
class TensorPlan:
    name: str
    buffer: str | None   # the arena buffer it lives in (None: input, constant, unplannable)
    kind: str            # planned | view | inplace | input | const | unplannable
    offset: int | None
    size: int | None
    first: int
    last: int


class BufferRecord(TypedDict):
    """One arena buffer: its offset and size, the step spans it is live, its tenant values."""
    name: str
    offset: int
    size: int
    spans: list[tuple[int, int]]      # (first step, last step) per span
    exclusive: bool
    members: list[str]


class Unplannable(TypedDict):
    name: str
    reason: str


class InPlace(TypedDict):
    node: str
    input: str
    output: str


class NotWritable(TypedDict):
    """A node whose kernel cannot write into its arena slot (filled at bind, runtime/bind.py)."""
    node: str
    op: str
    bytes: int


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
    buffers: list[BufferRecord] = field(default_factory=list)
    unplannable: list[Unplannable] = field(default_factory=list)
    inplace: list[InPlace] = field(default_factory=list)
    algorithms: dict[str, int] = field(default_factory=dict)      # algorithm -> arena bytes
    orders: dict[str, int] = field(default_factory=dict)          # order -> lower bound bytes
    order_floor_bytes: int | None = None  # no execution order's lower bound is below this
    order_floor_node: str | None = None   # the node whose step forces the floor
    warnings: list[str] = field(default_factory=list)
    not_writable_into_arena: list[NotWritable] = field(default_factory=list)  # filled at bind
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

    @classmethod
    def from_dict(cls, d: Any, path: str = "report.memory") -> "MemoryReport":
        """A stored ``to_dict()`` back as the record (derived keys skipped); an
        ``ArtifactError`` naming the field for anything malformed."""
        return typed(cls, d, path)

    def summary(self) -> str:
        mb = 1 / (1 << 20)
        return (f"memory[{self.mode}, order={self.order}, {self.algorithm}]: arena "
                f"{self.arena_bytes * mb:.2f} MiB, lower bound {self.lower_bound_bytes * mb:.2f} MiB "
                f"(x{self.ratio_to_lower_bound:.3f}), naive {self.naive_bytes * mb:.2f} MiB "
                f"(naive/arena {self.naive_over_arena:.1f}x), {len(self.inplace)} in-place, "
                f"{len(self.unplannable)} unplannable")
