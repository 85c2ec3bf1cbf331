"""``plan_memory(graph, config) -> MemoryPlan``: order, lifetimes and arena offsets of a graph.

Modes (``Config.memory``):
- ``off``: the default order, no in-place, every buffer its own bytes (the baseline);
- ``balanced``: the default order, views and in-place, every offset algorithm, smallest kept;
- ``tight``: as balanced, after choosing among memory-aware orders the one with the lowest peak
  (no search when the default order's peak equals the order floor of ``order_bound.py``, which
  no order can go below; the floor is reported in every mode).

Sizes come from static shapes x dtype itemsize; values without them are listed as unplannable
(the runtime allocates them per run). The result is pure data: the runtime later binds each
planned value to ``arena[offset : offset + size]`` viewed with its shape and dtype.
This module does not touch the graph and does not allocate anything; a plan over
``Config.max_arena_bytes`` is refused (``memory_cap.py``).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from ..ir import Graph, Node, Value
from .lifetime import LifetimeOptions, Lifetimes, compute_lifetimes, value_bytes
from .memory_cap import check_memory_cap
from .memory import DEFAULT_ALGORITHMS, Assignment, Buffer, Constraints, conflict_graph, live_bytes, plan
from ..report.memory import MemoryReport, TensorPlan
from .order import check_order, choose_order
from .order_bound import order_floor


@dataclass(frozen=True)
class PlanOptions:
    """alignment: arena offset multiple. algorithms: offset algorithms to try (None: by mode).
    exact_*: limits of the exact solver. dp_state_limit: Serenity beam width per level.
    release_after / inplace_ok: the stream hooks of ``LifetimeOptions`` (``stream_memory.py``
    builds them from a StreamPlan). order: force an execution order. sizes: each value's bytes
    (None: sized at run time) instead of its static shape's (``buckets.py``)."""
    alignment: int = 64
    algorithms: tuple[str, ...] | None = None
    exact_time_limit_s: float = 1.0
    exact_max_buffers: int = 150
    dp_state_limit: int = 1000
    release_after: Callable[[Value, int], int] | None = None
    inplace_ok: Callable[[Node, list[Value]], bool] | None = None
    order: tuple[Node, ...] | None = None
    sizes: Mapping[str, int | None] | None = None   # value name -> bytes, for a range of shapes


@dataclass
class MemoryPlan:
    order: list[Node]
    order_name: str
    lifetimes: Lifetimes
    constraints: Constraints
    assignment: Assignment
    report: MemoryReport

    def slot(self, value: Value | str) -> tuple[int, int] | None:
        """``(offset, size)`` of a value's bytes in the arena, or None when it is not planned."""
        name = value if isinstance(value, str) else value.name
        life = self.lifetimes.values.get(name)
        if life is None or life.buffer is None or life.size is None:
            return None
        return self.assignment.offsets[life.buffer], life.size

    def conflict_graph(self) -> dict:
        return conflict_graph(self.lifetimes.buffers, self.constraints)

    def slots(self) -> dict[str, tuple[int, int]]:
        """``{value name: (offset, size)}`` of every value with bytes in the arena."""
        return {name: s for name in self.lifetimes.values if (s := self.slot(name)) is not None}

    def to_dict(self) -> dict:
        """What the runtime needs, as plain JSON data: the order by node name, the arena size
        and each arena value's [offset, size]; plus the report."""
        return {"order": [n.name for n in self.order], "order_name": self.order_name,
                "arena_bytes": self.assignment.arena_bytes,
                "slots": {k: list(v) for k, v in self.slots().items()},
                "report": self.report.to_dict()}


def naive_bytes(graph: Graph, sizes=None) -> int:
    """Every activation (node output, views included) in its own buffer (``sizes``: value name
    -> bytes, instead of the static shapes')."""
    if sizes is not None:
        return sum(b for n in graph.nodes for o in n.outputs if isinstance(b := sizes.get(o.name), int))
    return sum(value_bytes(o) or 0 for n in graph.nodes for o in n.outputs)


def plan_memory(graph: Graph, config=None, options: PlanOptions = PlanOptions()) -> MemoryPlan:
    t0 = time.perf_counter()
    mode = getattr(config, "memory", "balanced") if config is not None else "balanced"
    hooks = dict(release_after=options.release_after, inplace_ok=options.inplace_ok, sizes=options.sizes)
    lt_opts = (LifetimeOptions.from_config(config, **hooks) if config is not None
               else LifetimeOptions(**hooks))
    if mode == "off":
        lt_opts = dataclasses.replace(lt_opts, inplace=False)

    def score(order: list[Node]) -> int:
        return compute_lifetimes(graph, order, lt_opts).lower_bound_bytes

    def live(order: list[Node]) -> list[int]:
        lt = compute_lifetimes(graph, order, lt_opts)
        return live_bytes(lt.buffers, lt.constraints())

    floor = order_floor(graph, lt_opts) if options.sizes is None else None
    if options.order is not None:
        order = list(options.order)
        check_order(graph, order)
        lifetimes = compute_lifetimes(graph, order, lt_opts)
        order_name, order_scores = "given", {"given": lifetimes.lower_bound_bytes}
    else:
        choice = choose_order(graph, score, mode, options.dp_state_limit,
                              floor.bytes if floor is not None else None, live)
        order, order_name, order_scores = choice.order, choice.name, choice.scores
        lifetimes = compute_lifetimes(graph, order, lt_opts)
    constraints = lifetimes.constraints(alignment=options.alignment,
                                        exact_time_limit_s=options.exact_time_limit_s,
                                        exact_max_buffers=options.exact_max_buffers)
    algorithms = options.algorithms or (("naive",) if mode == "off" else DEFAULT_ALGORITHMS)
    assignment = plan(lifetimes.buffers, constraints, algorithms)
    report = _report(graph, mode, order_name, order_scores, lifetimes, constraints, assignment, options.sizes)
    if floor is not None:
        report.order_floor_bytes, report.order_floor_node = floor.bytes, floor.node
    report.seconds = time.perf_counter() - t0
    check_memory_cap(graph, assignment.arena_bytes, getattr(config, "max_arena_bytes", None))
    return MemoryPlan(order, order_name, lifetimes, constraints, assignment, report)


def _report(graph: Graph, mode: str, order_name: str, order_scores: dict, lifetimes: Lifetimes,
            constraints: Constraints, assignment: Assignment, sizes=None) -> MemoryReport:
    offsets = assignment.offsets
    tensors = [TensorPlan(v.name, v.buffer, v.kind, offsets.get(v.buffer) if v.buffer else None, v.size,
                          v.first, v.last) for v in lifetimes.values.values()]
    buffers = [_buffer_dict(b, offsets[b.name], b.name in constraints.exclusive, lifetimes.members[b.name])
               for b in lifetimes.buffers]
    return MemoryReport(
        mode=mode, arena_bytes=assignment.arena_bytes, lower_bound_bytes=lifetimes.lower_bound_bytes,
        naive_bytes=naive_bytes(graph, sizes), algorithm=assignment.algorithm, optimal=assignment.optimal,
        order=order_name, steps=lifetimes.steps, alignment=constraints.alignment, tensors=tensors,
        buffers=buffers, unplannable=[{"name": n, "reason": r} for n, r in lifetimes.unplannable],
        inplace=[{"node": n, "input": i, "output": o} for n, i, o in lifetimes.inplace],
        algorithms=dict(assignment.candidates), orders=dict(order_scores), warnings=list(lifetimes.warnings))


def _buffer_dict(b: Buffer, offset: int, exclusive: bool, members: list[str]) -> dict:
    return {"name": b.name, "offset": offset, "size": b.size, "spans": [(int(s[0]), int(s[1])) for s in b.spans],
            "exclusive": exclusive, "members": list(members)}
