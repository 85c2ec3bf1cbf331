"""Happens-before of a StreamPlan, and the memory planner's stream hooks built from it.

With several streams, the planner's steps (positions in the execution order) no longer say
what runs before what: only a stream's own order and its event waits do. ``HappensBefore``
holds, per node, the set of nodes ordered after it (bitsets over step positions) through
stream order and events alone, which is exactly what the runtime enforces.

Hooks for ``plan_memory`` (see ``lifetime.py``):
- ``release_after(value, last)``: the last step whose node is *not* ordered after every node
  touching the value (its producer and its readers). A buffer freed there is reused only by a
  node at a later step, hence one that an event or its stream orders after all of them; two
  values on different streams thus share bytes only when an event orders them.
- ``inplace_ok(node, values)``: an in-place takeover needs every other reader of the buffer's
  values to be ordered before ``node``.
``check_stream_plan`` verifies that every data edge is ordered (producer before consumer).
Nothing here mutates the graph or the plan.
"""
from __future__ import annotations

from ..errors import PlanError
from ..ir import Graph, Node, Value


class HappensBefore:
    def __init__(self, order: list[Node], plan):
        self.order = list(order)
        self.step = {n.name: i for i, n in enumerate(self.order)}
        n = len(self.order)
        succ: list[set[int]] = [set() for _ in range(n)]
        seen: set[str] = set()
        for k, names in enumerate(plan.per_stream):
            for name in names:
                if name not in self.step:
                    raise PlanError(f"stream {k} lists node {name!r}, which is not in the execution order")
                if name in seen:
                    raise PlanError(f"node {name!r} is on more than one stream")
                seen.add(name)
            for a, b in zip(names, names[1:]):
                succ[self.step[a]].add(self.step[b])
        if len(seen) != n:
            missing = sorted(set(self.step) - seen)[:5]
            raise PlanError(f"nodes {missing} are on no stream")
        producer = {e.id: e.producer for e in plan.events}
        for name, ids in plan.waits.items():
            for eid in ids:
                if eid not in producer:
                    raise PlanError(f"node {name!r} waits on unknown event {eid}")
                succ[self.step[producer[eid]]].add(self.step[name])
        self.succ = succ
        self.topo = _topological(succ)
        desc = [0] * n
        for i in reversed(self.topo):
            d = 0
            for j in succ[i]:
                d |= desc[j] | (1 << j)
            desc[i] = d
        self.desc = desc
        self.all = (1 << n) - 1

    def before(self, a: Node, b: Node) -> bool:
        """``a`` finishes before ``b`` starts (by stream order and events)."""
        return bool(self.desc[self.step[a.name]] >> self.step[b.name] & 1)

    def release_step(self, i: int) -> int:
        """The last step not ordered after step ``i`` (at least ``i``)."""
        rest = self.all & ~self.desc[i] & ~(1 << i)
        return max(i, rest.bit_length() - 1)

    def issue_order(self) -> list[Node]:
        """A single-thread order that respects stream order and events, close to the plan's."""
        return [self.order[i] for i in self.topo]


def _topological(succ: list[set[int]]) -> list[int]:
    """Kahn's algorithm, smallest step first (so a consistent plan keeps its order)."""
    import heapq
    n = len(succ)
    indeg = [0] * n
    for s in succ:
        for j in s:
            indeg[j] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(out) != n:
        raise PlanError("the stream plan's waits form a cycle: the streams would deadlock")
    return out


def check_stream_plan(graph: Graph, order: list[Node], plan) -> HappensBefore:
    """Raise PlanError unless every producer -> consumer edge is ordered by the plan."""
    hb = HappensBefore(order, plan)
    for node in order:
        for v in node.inputs:
            p = None if v is None else v.producer
            if p is not None and p.name in hb.step and not hb.before(p, node):
                raise PlanError(f"{graph.name}: stream plan lets {node.name!r} (stream "
                                f"{plan.stream_of.get(node.name)}) read %{v.name} before its producer "
                                f"{p.name!r} (stream {plan.stream_of.get(p.name)}) is known to have run")
    return hb


def stream_hooks(graph: Graph, order: list[Node], plan):
    """``(release_after, inplace_ok)`` for ``PlanOptions`` from a StreamPlan on ``order``."""
    hb = check_stream_plan(graph, order, plan)
    release = [hb.release_step(i) for i in range(len(hb.order))]

    def touching(v: Value) -> list[int]:
        steps = [hb.step[u.name] for u in v.users if u.name in hb.step]
        if v.producer is not None and v.producer.name in hb.step:
            steps.append(hb.step[v.producer.name])
        return steps

    def release_after(v: Value, last: int) -> int:
        return max([last] + [release[i] for i in touching(v)])

    def inplace_ok(node: Node, values: list[Value]) -> bool:
        for v in values:
            for u in v.users:
                if u is not node and u.name in hb.step and not hb.before(u, node):
                    return False
        return True

    return release_after, inplace_ok
