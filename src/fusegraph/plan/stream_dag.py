"""The stream planner's shared core: the dependency DAG of an execution order (``Dag``), list
scheduling onto ``n`` streams (``list_schedule``), the transitive reduction of the
cross-stream waits (``reduce_waits``, vector clocks) and the makespan simulation
(``simulate``). ``streams.py`` builds plans from them and ``stream_hybrid.py`` its hybrid
(wide / narrow) candidates. Nothing here mutates the graph or runs a kernel.
"""
from __future__ import annotations

import heapq

from ..ir import Node


class Dag:
    """Producer/consumer indices over ``order`` (index = position in the order)."""

    def __init__(self, order: list[Node]):
        self.nodes = list(order)
        self.names = [n.name for n in self.nodes]
        if len(set(self.names)) != len(self.names):
            raise ValueError("node names must be unique to plan streams")
        index = {id(n): i for i, n in enumerate(self.nodes)}
        self.preds: list[list[int]] = [[] for _ in self.nodes]
        self.succs: list[list[int]] = [[] for _ in self.nodes]
        for i, node in enumerate(self.nodes):
            for v in node.inputs:
                p = index.get(id(v.producer)) if v is not None and v.producer is not None else None
                if p is None or p in self.preds[i]:
                    continue
                if p >= i:
                    raise ValueError(f"order runs {node.name} before its producer {self.names[p]}")
                self.preds[i].append(p)
                self.succs[p].append(i)
        # chain link: the node's only producer has it as its only consumer
        self.chain_pred = [self.preds[i][0] if len(self.preds[i]) == 1 and len(self.succs[self.preds[i][0]]) == 1
                           else None for i in range(len(self.nodes))]

    def __len__(self) -> int:
        return len(self.nodes)

    def bottom_levels(self, cost: list[float]) -> list[float]:
        bl = [0.0] * len(self)
        for i in range(len(self) - 1, -1, -1):
            bl[i] = cost[i] + max((bl[s] for s in self.succs[i]), default=0.0)
        return bl

    def critical_path(self, cost: list[float]) -> tuple[float, list[int]]:
        if not len(self):
            return 0.0, []
        bl = self.bottom_levels(cost)
        i = max((k for k in range(len(self)) if not self.preds[k]), key=lambda k: (bl[k], -k))
        path = [i]
        while self.succs[i]:
            i = max(self.succs[i], key=lambda s: (bl[s], -s))
            path.append(i)
        return bl[path[0]], path


def list_schedule(dag: Dag, cost: list[float], n: int, sync: float, priority: str) -> list[int]:
    """Stream of each node: list scheduling by ``priority`` (``critical`` or ``order``), each node
    on the stream where it starts earliest (chains stay on their producer's stream)."""
    stream = [-1] * len(dag)
    finish = [0.0] * len(dag)
    free = [0.0] * n
    if priority == "critical":
        bl = dag.bottom_levels(cost)
        waiting = [len(p) for p in dag.preds]
        ready = [(-bl[i], i) for i in range(len(dag)) if not waiting[i]]
        heapq.heapify(ready)

        def pop():
            return heapq.heappop(ready)[1] if ready else None
    else:
        it = iter(range(len(dag)))

        def pop():
            return next(it, None)
    while (i := pop()) is not None:
        preds = dag.preds[i]
        link = dag.chain_pred[i]
        if link is not None:
            k = stream[link]
            start = max(free[k], finish[link])
        else:
            home = stream[max(preds, key=lambda p: (finish[p], -p))] if preds else -1
            best = None
            for k in range(n):
                ready_at = max((finish[p] + (0.0 if stream[p] == k else sync) for p in preds), default=0.0)
                key = (max(free[k], ready_at), k != home, k)
                if best is None or key < best:
                    best = key
            start, _, k = best
        stream[i], finish[i] = k, start + cost[i]
        free[k] = finish[i]
        if priority == "critical":
            for s in dag.succs[i]:
                waiting[s] -= 1
                if not waiting[s]:
                    heapq.heappush(ready, (-bl[s], s))
    return stream


def reduce_waits(dag: Dag, stream: list[int], n: int, extra: list[list[int]] | None = None) -> list[list[int]]:
    """Per node, the producers on other streams it must wait on (vector-clock reduction);
    ``extra``: ordering edges beyond the data edges (hybrid plans' exclusion edges)."""
    position = [0] * len(dag)
    count = [0] * n
    for i in range(len(dag)):
        position[i], count[stream[i]] = count[stream[i]], count[stream[i]] + 1
    clock = [[-1] * n for _ in range(n)]      # per stream: last position known done on each stream
    node_clock: list[list[int]] = [[]] * len(dag)
    waits: list[list[int]] = [[] for _ in range(len(dag))]
    for i in range(len(dag)):
        s = stream[i]
        known = clock[s]
        preds = dag.preds[i] if extra is None else set(dag.preds[i]) | set(extra[i])
        for p in sorted((p for p in preds if stream[p] != s), reverse=True):
            if known[stream[p]] >= position[p]:
                continue
            waits[i].append(p)
            known = [max(a, b) for a, b in zip(known, node_clock[p])]
        known = list(known)
        known[s] = position[i]
        clock[s] = node_clock[i] = known
    return waits


def simulate(stream: list[int], waits: list[list[int]], cost: list[float], n: int,
             sync: float) -> list[float]:
    """Start time of every node when each stream runs its nodes in order (index order)."""
    free = [0.0] * n
    start = [0.0] * len(stream)
    finish = [0.0] * len(stream)
    for i, k in enumerate(stream):
        start[i] = max([free[k]] + [finish[p] + sync for p in waits[i]])
        finish[i] = free[k] = start[i] + cost[i]
    return start
