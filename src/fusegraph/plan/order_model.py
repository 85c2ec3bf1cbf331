"""``OrderModel``: the simplified memory model the order heuristics share (``order.py``,
``serenity.py``, ``exhaustive.py``): node indices in the default order, producers and
consumers, and per-root byte accounting (views cost nothing and extend their source; in-place
is ignored); and the graph's split at cut nodes that the segment-wise searches work on.

A *free* node has no producer among the graph's nodes (it reads only constants and graph
inputs). A *cut* node has every other non-free node as its ancestor or descendant: every
topological order runs its ancestors before it and its descendants after, so the segments
between cuts can be ordered independently. Nothing here mutates the graph.
"""
from __future__ import annotations

from ..ir import Graph, Node
from .aliasing import view_source
from .lifetime import value_bytes


class OrderModel:
    """Node indices (default order), producers/consumers, and per-root byte accounting."""

    def __init__(self, graph: Graph):
        self.nodes = list(graph.nodes)
        n = len(self.nodes)
        index = {id(x): i for i, x in enumerate(self.nodes)}
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        root: dict[int, int] = {}       # id(value) -> id(root value)
        self.size: dict[int, int] = {}  # id(root) -> bytes
        self.out_roots: list[list[int]] = [[] for _ in range(n)]
        self.in_roots: list[list[int]] = [[] for _ in range(n)]
        for i, node in enumerate(self.nodes):
            for v in node.inputs:
                if v is None or v.is_const or v.producer is None or id(v.producer) not in index:
                    continue
                p = index[id(v.producer)]
                if p not in self.preds[i]:
                    self.preds[i].append(p)
                    self.succs[p].append(i)
                r = root.get(id(v), id(v))
                if r not in self.in_roots[i]:
                    self.in_roots[i].append(r)
            src = view_source(node)
            for k, o in enumerate(node.outputs):
                s = node.inputs[src] if src is not None and k == 0 else None
                if s is not None and not s.is_const and s.producer is not None:
                    root[id(o)] = root.get(id(s), id(s))
                    continue
                root[id(o)] = id(o)
                self.size[id(o)] = value_bytes(o) or 0
                self.out_roots[i].append(id(o))
        self.consumers: dict[int, int] = {r: 0 for r in self.size}  # root -> bitset of readers
        for i in range(n):
            for r in self.in_roots[i]:
                self.consumers[r] |= 1 << i
        self.pinned = {root.get(id(v), id(v)) for v in graph.outputs}
        self.free = [not self.preds[i] for i in range(n)]
        self.out_bytes = [sum(self.size[r] for r in self.out_roots[i]) for i in range(n)]
        # per node: (readers bitset, bytes) of every root it reads or makes that it may release
        self.release = [tuple((self.consumers[r], self.size[r])
                              for r in dict.fromkeys(self.in_roots[i] + self.out_roots[i])
                              if r not in self.pinned and r in self.consumers) for i in range(n)]

    def freed_by(self, i: int, done_mask: int) -> int:
        """Bytes released once node ``i`` has run, given ``done_mask`` (which includes ``i``)."""
        return sum(size for readers, size in self.release[i] if not readers & ~done_mask)

    def with_free_nodes(self, core: list[int]) -> list[Node]:
        """``core`` (every non-free index) with each free node inserted before its first consumer."""
        before: dict[int, list[int]] = {}
        tail: list[int] = []
        position = {i: k for k, i in enumerate(core)}
        for i in range(len(self.nodes)):
            if self.free[i]:
                users = [position[s] for s in self.succs[i]]
                if users:
                    before.setdefault(core[min(users)], []).append(i)
                else:
                    tail.append(i)
        out: list[Node] = []
        for i in core:
            out.extend(self.nodes[j] for j in before.get(i, ()))
            out.append(self.nodes[i])
        out.extend(self.nodes[j] for j in tail)
        return out


def cut_segments(m: OrderModel, core: list[int]) -> list[list[int]]:
    """Split ``core`` (non-free nodes, default topological order) at cut nodes."""
    anc: dict[int, int] = {}
    for i in core:
        a = 0
        for p in m.preds[i]:
            if not m.free[p]:
                a |= anc[p] | (1 << p)
        anc[i] = a
    desc: dict[int, int] = {}
    for i in reversed(core):
        d = 0
        for s in m.succs[i]:
            d |= desc[s] | (1 << s)
        desc[i] = d
    total = len(core)
    segments: list[list[int]] = []
    current: list[int] = []
    for i in core:  # a cut's ancestors all precede it in any topological order, core included
        if anc[i].bit_count() + desc[i].bit_count() + 1 == total:
            if current:
                segments.append(current)
            segments.append([i])
            current = []
        else:
            current.append(i)
    if current:
        segments.append(current)
    return segments


def free_nodes_joined(m: OrderModel, segments: list[list[int]]) -> list[list[int]]:
    """Put each free node in the segment of its first consumer (unread ones in the last).

    Running a free node (it reads no arena buffer) earlier than the segment of its first
    consumer only keeps its output live longer, so no order is lost: the segment's DP then
    places it exactly. (Leaving free nodes out of the DP, as before, ignored their bytes.)"""
    where = {i: k for k, seg in enumerate(segments) for i in seg}
    out = [list(seg) for seg in segments] or [[]]
    for i in range(len(m.nodes)):
        if m.free[i]:
            ks = [where[s] for s in m.succs[i] if s in where]
            out[min(ks) if ks else len(out) - 1].insert(0, i)
    return [seg for seg in out if seg]
