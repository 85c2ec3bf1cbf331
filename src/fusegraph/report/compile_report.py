"""``CompileReport``: the data behind ``model.report`` (pure data, JSON-serialisable)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PassStat:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class FusionRecord:
    rule: str
    applied: bool
    nodes: list[str]
    reason: str = ""


@dataclass
class CompileReport:
    model: str = ""
    nodes_imported: int = 0
    nodes_final: int = 0
    kernel_count: int = 0          # kernels launched per run (with the input shapes seen before)
    shape_kernels: int = 0         # kernels run once per input shapes instead (runtime/shape_memo.py)
    op_histogram: dict[str, int] = field(default_factory=dict)
    kernels: dict[str, Any] = field(default_factory=dict)   # backend, implementations, declined (runtime/bind.py)
    passes: list[PassStat] = field(default_factory=list)
    fusions: list[FusionRecord] = field(default_factory=list)
    unfolded: list[dict[str, Any]] = field(default_factory=list)
    memory: Any = None
    precision: dict[str, Any] | None = None   # passes/precision.py: policy, per-node dtypes, casts
    streams: Any = None
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("memory", "streams"):
            value = getattr(self, key)
            d[key] = value.to_dict() if hasattr(value, "to_dict") else value
        return d
