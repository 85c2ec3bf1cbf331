"""Serenity-style memory-aware scheduling: a dynamic program over sets of scheduled nodes.

After Ahn et al., "Ordering Chaos: Memory-Aware Scheduling of Irregularly Wired Neural
Networks for Edge Devices" (MLSys 2020). The live bytes after running a set ``S`` of nodes
depend on ``S`` alone, so for every reachable ``S`` (a down-set of the DAG) the DP keeps the
smallest peak of any order reaching it. The graph is first split at *cut nodes* (every other
node is their ancestor or descendant): every topological order runs a cut's ancestors before it
and its descendants after, so segments are solved independently and chained. Within a segment
the DP goes level by level (|S| = k); when a level holds more than ``state_limit`` states only
the best ones (by peak, then live bytes) are kept, which makes it a beam search rather than
exact; the beam also narrows to keep the total number of transitions within ``budget``, so
``serenity_order`` stays bounded in time on any graph (exact on small or well-cut graphs).

Works on ``order_model.OrderModel``. Free nodes (they read no arena buffer) join the DP in the segment
of their first consumer, so their outputs' bytes count (``order_model.free_nodes_joined``).
"""
from __future__ import annotations

from ..ir import Node
from .order_model import OrderModel, cut_segments, free_nodes_joined


def _solve_segment(m: OrderModel, seg: list[int], prefix: int, state_limit: int,
                   budget: int) -> tuple[list[int], int]:
    """Best order of ``seg`` (its producers outside it are all in ``prefix``); work done."""
    if len(seg) == 1:
        return list(seg), 1
    in_seg = set(seg)
    pred_mask = {i: sum(1 << p for p in m.preds[i] if p in in_seg) for i in seg}
    succs = {i: [x for x in m.succs[i] if x in in_seg] for i in seg}
    per_level = max(1, budget // len(seg))
    # state: mask -> (peak, live, parent_mask, node, ready): ready is a bitset, so a transition
    # costs O(1) set operations however many nodes are ready (free nodes can make hundreds)
    level = {0: (0, 0, None, None, sum(1 << i for i in seg if not pred_mask[i]))}
    levels = [level]
    work = 0
    for _ in range(len(seg)):
        nxt: dict[int, tuple] = {}
        for mask, (peak, live, _, _, ready) in level.items():
            done = prefix | mask
            for v in _bits(ready):
                work += 1
                bit = 1 << v
                step_peak = live + m.out_bytes[v]
                if step_peak < peak:
                    step_peak = peak
                new_mask = mask | bit
                old = nxt.get(new_mask)
                if old is not None and old[0] <= step_peak:
                    continue
                new_done = done | bit
                new_live = live + m.out_bytes[v] - m.freed_by(v, new_done)
                new_ready = ready & ~bit
                for x in succs[v]:
                    if not pred_mask[x] & ~new_done:
                        new_ready |= 1 << x
                nxt[new_mask] = (step_peak, new_live, mask, v, new_ready)
        fanout = max(1, sum(st[4].bit_count() for st in nxt.values()) // max(1, len(nxt)))
        width = max(1, min(state_limit, per_level // fanout))
        if len(nxt) > width:
            nxt = dict(sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))[:width])
        level = nxt
        levels.append(level)
    order: list[int] = []
    mask = next(iter(level))  # the last level holds exactly one state: the whole segment
    for depth in range(len(seg), 0, -1):
        _, _, parent, node, _ = levels[depth][mask]
        order.append(node)
        mask = parent
    order.reverse()
    return order, work


def serenity_order(m: OrderModel, state_limit: int = 1000, budget: int = 200_000,
                   lazy_free: bool = False) -> list[Node]:
    """``budget`` bounds the DP's transitions over the whole graph; segments share it by size.
    ``lazy_free``: leave free nodes out of the DP (their bytes uncounted) and run each right
    before its first consumer; smaller DP states, not exact."""
    core = [i for i in range(len(m.nodes)) if not m.free[i]]
    segments = cut_segments(m, core) if lazy_free else free_nodes_joined(m, cut_segments(m, core))
    prefix = sum(1 << i for i in range(len(m.nodes)) if m.free[i]) if lazy_free else 0
    result: list[int] = []
    remaining_nodes, remaining = sum(len(seg) for seg in segments), budget
    for seg in segments:
        share = max(len(seg), remaining * len(seg) // max(1, remaining_nodes))
        part, work = _solve_segment(m, seg, prefix, state_limit, share)
        remaining = max(0, remaining - work)
        remaining_nodes -= len(seg)
        result.extend(part)
        for i in part:
            prefix |= 1 << i
    return m.with_free_nodes(result) if lazy_free else [m.nodes[i] for i in result]


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
