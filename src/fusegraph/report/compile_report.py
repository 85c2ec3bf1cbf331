"""``CompileReport``: the data behind ``model.report`` (pure data, JSON-serialisable), and its parts
``PassStat`` and ``FusionRecord``.

A compiled model's report and a loaded one's are the same classes: ``to_dict`` writes it for the
artifact, ``CompileReport.from_dict`` reads it back typed and checked (``typed_json.py``: a
malformed part is an ``ArtifactError`` naming it), the memory and stream parts as
``MemoryReport`` and ``StreamPlan``, the kernel and precision parts as the dicts
``parts.py`` describes. ``str(report)`` is a short summary (``summary.py``), ``repr`` one line
of it, and a ``rich`` console prints it as a table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .memory import MemoryReport
from .parts import KernelSummary, PrecisionSummary
from .streams import StreamPlan
from .typed_json import typed


@dataclass
class PassStat:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)
    verify_seconds: float = 0.0    # Graph.verify after this pass (only under Config.verify_each)


@dataclass
class FusionRecord:
    rule: str
    applied: bool
    nodes: list[str]
    reason: str = ""


@dataclass(repr=False)     # its fields are thousands of records: repr is one line (``summary.py``)
class CompileReport:
    model: str = ""
    nodes_imported: int = 0
    nodes_final: int = 0
    kernel_count: int = 0          # kernels launched per run (with the input shapes seen before)
    shape_kernels: int = 0         # kernels run once per input shapes instead (runtime/shape_memo.py)
    op_histogram: dict[str, int] = field(default_factory=dict)
    kernels: KernelSummary = field(default_factory=dict)   # backend, implementations, declined (runtime/bind.py)
    passes: list[PassStat] = field(default_factory=list)
    fusions: list[FusionRecord] = field(default_factory=list)
    unfolded: list[dict[str, Any]] = field(default_factory=list)
    memory: MemoryReport | None = None
    precision: PrecisionSummary | None = None   # passes/precision.py: policy, per-node dtypes, casts
    streams: StreamPlan | None = None
    # seconds per stage: import, infer, passes (verify: the part of it spent in Graph.verify),
    # plan, bind; a loaded model's adds load
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory"] = None if self.memory is None else self.memory.to_dict()
        d["streams"] = None if self.streams is None else self.streams.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Any, path: str = "report") -> "CompileReport":
        """A stored ``to_dict()`` back as the record a compile makes; an ``ArtifactError``
        naming the part (``report.memory.tensors[3].offset``) for anything malformed."""
        report = typed(cls, d, path)
        if report.streams is not None:
            report.streams.check(f"{path}.streams")
        return report

    def __str__(self) -> str:
        from .summary import report_text
        return report_text(self)

    def __repr__(self) -> str:
        from .summary import report_repr
        return report_repr(self)

    def __rich__(self):
        from .summary import report_table
        return report_table(self)
