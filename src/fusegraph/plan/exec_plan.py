"""``ExecutionPlan``: everything the runtime needs from planning, as pure data.

It is what ``compiler/planning.py`` hands the runtime and what an artifact can store (``to_dict`` /
``from_dict``, JSON only): the execution order by node name, the memory mode, the arena size,
each arena value's ``(offset, size)`` (values written by their kernel into the arena: planned
and in-place tenants; views and inputs have no slot of their own), the planner's kind of every
non-trivial value (the runtime needs to know which outputs the planner treated as views), and
the stream plan (``plan/streams.py``), or None for one stream. A model with symbolic input
dims has a *symbolic* plan: its order only, its offsets planned per bucket of shapes at run
time (``buckets.py``).
Nothing here touches the graph or allocates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..report.streams import StreamPlan

ARENA_KINDS = ("planned", "inplace")


@dataclass
class ExecutionPlan:
    order: list[str]
    memory_mode: str = "off"
    arena_bytes: int = 0
    slots: dict[str, tuple[int, int]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)   # value name -> planner kind
    streams: StreamPlan | None = None
    # made for a range of input shapes (symbolic input dims): no slots here; each bucket of
    # shapes gets its offsets at run time, from the sizes at that bucket (``buckets.py``)
    symbolic: bool = False

    @property
    def uses_arena(self) -> bool:
        return self.memory_mode != "off" and self.arena_bytes > 0 and bool(self.slots)

    @classmethod
    def for_symbolic(cls, order: list[str], mode: str, streams=None) -> "ExecutionPlan":
        """The plan of a model with symbolic input dims: its order (every bucket's plan keeps it)."""
        return cls(list(order), mode, 0, {}, {}, streams, symbolic=True)

    @classmethod
    def from_memory_plan(cls, mplan, mode: str, streams=None) -> "ExecutionPlan":
        values = mplan.lifetimes.values
        slots = {} if mode == "off" else {
            name: s for name, life in values.items()
            if life.kind in ARENA_KINDS and (s := mplan.slot(name)) is not None}
        kinds = {name: life.kind for name, life in values.items() if life.kind != "planned"}
        return cls([n.name for n in mplan.order], mode, 0 if mode == "off" else mplan.assignment.arena_bytes,
                   slots, kinds, streams)

    def to_dict(self) -> dict:
        streams = None if self.streams is None else self.streams.to_dict()
        return {"order": list(self.order), "memory_mode": self.memory_mode, "arena_bytes": self.arena_bytes,
                "slots": {k: list(v) for k, v in self.slots.items()}, "kinds": dict(self.kinds),
                "streams": streams, "symbolic": self.symbolic}

    @classmethod
    def from_dict(cls, d: dict) -> "ExecutionPlan":
        """A stored ``to_dict()`` back (the stream plan typed: ``StreamPlan.from_dict``); the
        caller checks it against its graph (``artifact/plan.py``)."""
        streams = None if d.get("streams") is None else StreamPlan.from_dict(d["streams"], "plan.streams")
        return cls(list(d["order"]), d.get("memory_mode", "off"), int(d.get("arena_bytes", 0)),
                   {k: (int(v[0]), int(v[1])) for k, v in d.get("slots", {}).items()},
                   dict(d.get("kinds", {})), streams, bool(d.get("symbolic", False)))
