"""``StreamPlan``: which stream runs each node and which events order the streams (pure data,
``report.streams`` and the execution plan's ``streams``; the same record whether the model was
compiled or loaded: ``from_dict`` reads a stored one back typed). ``plan/streams.py`` makes it;
``to_text`` is what ``fusegraph inspect --streams`` prints (node names escaped: ``printable``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ArtifactError
from .printable import printable
from .typed_json import typed


@dataclass
class StreamEvent:
    id: int
    producer: str          # node recorded after it runs
    stream: int            # stream of the producer


@dataclass
class StreamPlan:
    num_streams: int
    stream_of: dict[str, int]
    per_stream: list[list[str]]
    events: list[StreamEvent]
    waits: dict[str, list[int]]          # every node; [] when it waits on nothing
    records: dict[str, int]              # only nodes that record an event
    critical_path: float                 # estimated µs of the longest dependency chain
    total_work: float                    # estimated µs of all nodes (at this plan's threads)
    estimated_parallelism: float         # total_work / critical_path
    critical_nodes: list[str] = field(default_factory=list)
    estimated_time: float = 0.0          # simulated makespan of this plan (µs)
    sequential_time: float = 0.0         # one stream, all cores per kernel (µs)
    requested: int | str = 1
    device: str = "cpu"
    threads_per_stream: int = 1
    algorithm: str = "trivial"
    candidates: dict[int, float] = field(default_factory=dict)   # streams -> estimated µs
    op_of: dict[str, str] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    start: dict[str, float] = field(default_factory=dict)        # simulated start (µs)
    wide: list[str] = field(default_factory=list)   # hybrid: nodes run alone with every thread

    @property
    def estimated_speedup(self) -> float:
        return self.sequential_time / self.estimated_time if self.estimated_time > 0 else 1.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["candidates"] = {str(k): v for k, v in self.candidates.items()}
        d["estimated_speedup"] = self.estimated_speedup
        d["cost_unit"] = "us"
        return d

    @classmethod
    def from_dict(cls, d: Any, path: str = "report.streams") -> "StreamPlan":
        """A stored ``to_dict()`` back as the record (derived keys skipped); an
        ``ArtifactError`` naming the field for anything malformed."""
        plan = typed(cls, d, path)
        plan.check(path)
        return plan

    def check(self, path: str = "streams") -> None:
        """The plan holds together as ``to_text`` and the runtime read it: its stream count,
        per-stream lists and stream assignment agree, and every wait names an event (an
        ``ArtifactError`` otherwise; whether it orders the graph is ``artifact/plan.py``'s)."""
        n = self.num_streams
        if not 1 <= n <= max(1, len(self.stream_of)) or len(self.per_stream) != n:
            raise ArtifactError(f"{path}: absurd stream count {n} for {len(self.stream_of)} node(s) and "
                                f"{len(self.per_stream)} per-stream list(s)")
        if not all(0 <= k < n for k in self.stream_of.values()):
            raise ArtifactError(f"{path}: a node is assigned to a stream outside 0..{n - 1}")
        ids = {e.id for e in self.events}
        if any(e not in ids for waits in self.waits.values() for e in waits):
            raise ArtifactError(f"{path}: a wait names an event the plan does not record")

    def to_text(self) -> str:
        """A readable table: one row per node in execution order, one column per stream."""
        lines = [f"streams: {self.num_streams} (asked {self.requested}, {self.device}, "
                 f"{self.threads_per_stream} thread(s) each, {self.algorithm}); events: {len(self.events)}",
                 f"estimated: work {self.total_work:.0f} us, critical path {self.critical_path:.0f} us, "
                 f"parallelism {self.estimated_parallelism:.2f}; time {self.estimated_time:.0f} us vs "
                 f"{self.sequential_time:.0f} us on one stream (x{self.estimated_speedup:.2f})"
                 + (f"; {len(self.wide)} wide node(s)" if self.wide else "")]
        if self.candidates:
            lines.append("candidates: " + ", ".join(f"{k}: {v:.0f} us" for k, v in sorted(self.candidates.items())))
        producer = {e.id: e.producer for e in self.events}
        critical, wide = set(self.critical_nodes), set(self.wide)
        shown = {n: printable(n) for n in self.stream_of}
        width = max([len(n) for n in shown.values()] + [8])
        lines.append(f"{'start us':>9} {'cost us':>8}  " + "  ".join(f"{'s' + str(k):<{width}}"
                                                                   for k in range(self.num_streams)))
        for name in sorted(self.stream_of, key=lambda n: (self.start.get(n, 0.0), self.stream_of[n])):
            k = self.stream_of[name]
            cells = [""] * self.num_streams
            cells[k] = shown[name]
            notes = [printable(self.op_of.get(name, "?"))]
            if self.waits.get(name):
                notes.append("waits " + ", ".join(f"e{e}<{printable(producer.get(e, '?'))}"
                                                  for e in self.waits[name]))
            if name in self.records:
                notes.append(f"records e{self.records[name]}")
            if name in wide:
                notes.append("wide")
            if name in critical:
                notes.append("*")
            lines.append(f"{self.start.get(name, 0.0):>9.0f} {self.cost.get(name, 0.0):>8.1f}  "
                         + "  ".join(f"{c:<{width}}" for c in cells) + "  " + " ".join(notes))
        lines.append("(* on the critical path; eN<p: event N recorded after p; wide: runs alone with every thread)")
        return "\n".join(lines)
