"""Hybrid CPU stream schedules: each node runs either *wide* (alone, with all the cores as
intra-op threads) or *narrow* (one of ``n`` streams, ``cores // n`` threads each, beside the
other streams' narrow nodes).

Why: at batch 1 on a few cores many kernels are too small to use several OpenMP threads well
(fork/join, barriers, memory-bound work), while the big ones scale. One stream with all the
threads wastes the small kernels' second thread; streams with one thread each waste the big
sequential kernels' (a stem convolution runs at half speed). The hybrid plan gives each node
the better of the two, where the graph has branches to overlap.

``region_schedule(dag, narrow, wide, n, sync)`` (the one that pays on the inception nets):
the order is cut where the graph narrows to one value (``region_cuts``); per region, every
node wide, or the region list-scheduled narrow, or narrow with its few best-scaling nodes
wide inside it, whichever the estimate prefers.

``hybrid_schedule(dag, narrow, wide, n, sync, priority)``: list scheduling by earliest
finish time; for each node (by ``priority``: highest bottom level or the planned order) the
candidates are "narrow on stream k" (start when stream k is free and its inputs are there,
``sync`` added for an input made on another stream) and "wide on stream 0" (start when every
stream is free); the earliest finish wins, a tie goes to wide (fewer threads in flight).

``exclusion_edges(stream, wide, n)``: the ordering edges that keep a wide node alone: from the
last node before it (in the order) of every other stream, and to the first node after it of
every other stream. Both point forward in the order, so the order stays a valid interleaving
(no deadlock); with the data edges they go through the same event reduction (``reduce_waits``).
Nothing here runs a kernel or mutates the graph.
"""
from __future__ import annotations

import heapq

from .stream_dag import Dag, list_schedule, reduce_waits, simulate


def hybrid_schedule(dag, narrow: list[float], wide: list[float], n: int, sync: float,
                    priority: str) -> tuple[list[int], list[bool]]:
    """(stream of each node, wide flag of each node)."""
    size = len(dag)
    stream = [-1] * size
    is_wide = [False] * size
    finish = [0.0] * size
    free = [0.0] * n
    if priority == "critical":
        bl = dag.bottom_levels([min(a, b) for a, b in zip(narrow, wide)])
        waiting = [len(p) for p in dag.preds]
        ready = [(-bl[i], i) for i in range(size) if not waiting[i]]
        heapq.heapify(ready)

        def pop():
            return heapq.heappop(ready)[1] if ready else None
    else:
        it = iter(range(size))

        def pop():
            return next(it, None)
    while (i := pop()) is not None:
        preds = dag.preds[i]

        def ready_on(k: int) -> float:
            return max((finish[p] + (0.0 if stream[p] == k else sync) for p in preds), default=0.0)

        # wide: stream 0, once every stream is idle (a stream that ran last needs an event)
        start = max([ready_on(0)] + [free[k] + (sync if k else 0.0) for k in range(n) if free[k] > 0])
        best = (start + wide[i], 0, 0, True)
        for k in range(n):
            s = max(free[k], ready_on(k))
            cand = (s + narrow[i], 1, k, False)
            if cand < best:
                best = cand
        end, _, k, w = best
        stream[i], is_wide[i], finish[i] = k, w, end
        if w:
            free = [end] * n
        else:
            free[k] = end
        if priority == "critical":
            for s in dag.succs[i]:
                waiting[s] -= 1
                if not waiting[s]:
                    heapq.heappush(ready, (-bl[s], s))
    return stream, is_wide


def region_cuts(dag) -> list[int]:
    """Positions ``p`` of the order (0 and ``len`` included) where every edge from a node
    before ``p`` to a node at or after it leaves one single node: the graph narrows to one
    value there (an inception module's concat), so the regions between cuts are independent."""
    cuts = [0]
    last_use = [max(s, default=-1) for s in dag.succs]
    open_: dict[int, None] = {}                      # nodes with a consumer at or after p
    for p in range(1, len(dag)):
        i = p - 1
        if last_use[i] >= p:
            open_[i] = None
        for j in [j for j in open_ if last_use[j] < p]:
            del open_[j]
        if len(open_) <= 1:
            cuts.append(p)
    cuts.append(len(dag))
    return sorted(set(cuts))


def region_schedule(dag, narrow: list[float], wide: list[float], n: int, sync: float,
                    min_nodes: int = 3, max_wide: int = 3) -> tuple[list[int], list[bool]]:
    """Per region between cuts, the fastest estimate of: every node wide on stream 0; the
    region list-scheduled narrow on ``n`` streams; the same with its 1..``max_wide`` nodes that
    gain most from the extra threads run wide (alone) inside it. Narrow candidates pay a fork
    and a join (``2 * sync``)."""
    stream = [0] * len(dag)
    is_wide = [True] * len(dag)
    cuts = region_cuts(dag)
    for a, b in zip(cuts, cuts[1:]):
        if b - a < min_nodes:
            continue
        sub = Dag(dag.nodes[a:b])
        one, two = narrow[a:b], wide[a:b]
        gain = sorted(range(b - a), key=lambda i: two[i] - one[i])
        best = (sum(two), None, None)
        for priority in ("critical", "order"):
            local = list_schedule(sub, one, n, sync, priority)
            for k in range(0, max_wide + 1):
                flags = [False] * (b - a)
                for i in gain[:k]:
                    if two[i] < one[i]:
                        flags[i] = True
                if k and sum(flags) < k:
                    break
                streams = [0 if f else s for s, f in zip(local, flags)]
                remap: dict[int, int] = {0: 0} if any(flags) else {streams[-1]: 0}
                streams = [remap.setdefault(s, len(remap)) for s in streams]
                used = max(streams) + 1
                if used < 2:
                    continue
                cost = [t if f else o for o, t, f in zip(one, two, flags)]
                waits = reduce_waits(sub, streams, used, exclusion_edges(streams, flags, used))
                start = simulate(streams, waits, cost, used, sync)
                span = max(s + c for s, c in zip(start, cost)) + 2 * sync
                if span < best[0]:
                    best = (span, streams, flags)
        if best[1] is not None:
            stream[a:b] = best[1]
            is_wide[a:b] = best[2]
    return stream, is_wide


def exclusion_edges(stream: list[int], wide: list[bool], n: int) -> list[list[int]]:
    """Per node, the extra predecessors that keep every wide node alone on the machine."""
    extra: list[list[int]] = [[] for _ in stream]
    last = [-1] * n                     # last node so far on each stream
    pending_wide = -1                   # the latest wide node; the next node of each stream waits on it
    released = [True] * n
    for i, k in enumerate(stream):
        if wide[i]:
            extra[i].extend(last[j] for j in range(n) if j != k and last[j] >= 0)
            pending_wide = i
            released = [j == k for j in range(n)]
        elif pending_wide >= 0 and not released[k]:
            extra[i].append(pending_wide)
            released[k] = True
        last[k] = i
    return extra
