"""Offset assignment into one arena: ``plan(buffers, constraints) -> Assignment``.

A ``Buffer`` is a name, a byte size and one or more inclusive step spans (several spans when a
reuse group merged tensors into one slot). Two buffers *conflict* when a span of one meets a
span of the other, or when either is exclusive; conflicting buffers must not overlap in the
arena. Every algorithm has the same signature ``(buffers, constraints) -> {name: offset}``;
``plan`` runs the requested ones, checks each result, and keeps the smallest arena.

Algorithms: ``greedy_by_size`` and ``greedy_by_breadth`` (Pisarchyk & Lee 2020, best-fit gap
among time-overlapping buffers), ``best_fit_spatial`` / ``best_fit_temporal`` / ``best_fit_area``
(XLA heap-simulator style: decreasing-size best fit over live intervals with XLA's sort keys),
``exact`` (CP-SAT or MILP with a time limit, see ``exact.py``) and ``naive`` (no sharing: the
``memory="off"`` baseline). Offsets are multiples of ``constraints.alignment``.

Pure data in, pure data out: nothing here knows the graph.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterable


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int
    spans: tuple[tuple[int, int], ...]

    @property
    def first(self) -> int:
        return min(a for a, _ in self.spans)

    @property
    def last(self) -> int:
        return max(b for _, b in self.spans)

    @property
    def length(self) -> int:
        return sum(b - a + 1 for a, b in self.spans)


@dataclass(frozen=True)
class Constraints:
    """alignment: offset multiple; exclusive: buffer names that never share bytes with another;
    exact_time_limit_s / exact_max_buffers bound the exact solver (skipped above that size)."""
    alignment: int = 64
    exclusive: frozenset = frozenset()
    exact_time_limit_s: float = 1.0
    exact_max_buffers: int = 150


@dataclass
class Assignment:
    offsets: dict[str, int]
    arena_bytes: int
    algorithm: str
    candidates: dict[str, int] = field(default_factory=dict)  # algorithm -> arena bytes
    optimal: bool = False  # proven minimal (arena equals the aligned lower bound, or solver proof)


def align_up(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment if alignment > 1 else x


def _spans_meet(a: Buffer, b: Buffer) -> bool:
    return any(s <= e2 and s2 <= e for s, e in a.spans for s2, e2 in b.spans)


def conflicts(buffers: list[Buffer], constraints: Constraints = Constraints()) -> list[set[int]]:
    """Adjacency (by index) of the conflict graph; zero-size buffers conflict with nothing."""
    n = len(buffers)
    adj: list[set[int]] = [set() for _ in range(n)]
    events = sorted((s, e, i) for i, b in enumerate(buffers) if b.size > 0 for s, e in b.spans)
    active: list[tuple[int, int]] = []  # (end, index)
    for s, e, i in events:
        active = [(e2, j) for e2, j in active if e2 >= s]
        for _, j in active:
            if j != i:
                adj[i].add(j)
                adj[j].add(i)
        active.append((e, i))
    excl = [i for i, b in enumerate(buffers) if b.name in constraints.exclusive and b.size > 0]
    for i in excl:
        for j in range(n):
            if j != i and buffers[j].size > 0:
                adj[i].add(j)
                adj[j].add(i)
    return adj


def conflict_graph(buffers: list[Buffer], constraints: Constraints = Constraints()) -> dict:
    """The conflict graph as plain data: nodes with size and spans, and an edge list."""
    adj = conflicts(buffers, constraints)
    return {
        "nodes": [{"name": b.name, "size": b.size, "spans": [list(s) for s in b.spans],
                   "exclusive": b.name in constraints.exclusive} for b in buffers],
        "edges": sorted([buffers[i].name, buffers[j].name] for i in range(len(adj)) for j in adj[i] if i < j),
    }


def conflict_graph_json(buffers: list[Buffer], constraints: Constraints = Constraints(), **kw) -> str:
    return json.dumps(conflict_graph(buffers, constraints), **kw)


def live_bytes(buffers: Iterable[Buffer], constraints: Constraints = Constraints(),
               size: Callable[[Buffer], int] | None = None) -> list[int]:
    """Bytes live at each step (exclusive buffers count at every step)."""
    buffers = list(buffers)
    if not buffers:
        return []
    size = size or (lambda b: b.size)
    horizon = max(b.last for b in buffers) + 1
    diff = [0] * (horizon + 1)
    for b in buffers:
        spans = ((0, horizon - 1),) if b.name in constraints.exclusive else b.spans
        for s, e in spans:
            diff[s] += size(b)
            diff[e + 1] -= size(b)
    out, run = [], 0
    for d in diff[:-1]:
        run += d
        out.append(run)
    return out


def lower_bound(buffers: Iterable[Buffer], constraints: Constraints = Constraints()) -> int:
    """Max over steps of the bytes live at once: no arena can be smaller."""
    return max(live_bytes(buffers, constraints), default=0)


def arena_of(buffers: list[Buffer], offsets: dict[str, int], alignment: int = 64) -> int:
    top = max((offsets[b.name] + b.size for b in buffers if b.size > 0), default=0)
    return align_up(top, alignment)


def check_assignment(buffers: list[Buffer], offsets: dict[str, int],
                     constraints: Constraints = Constraints()) -> None:
    """Raise ``AssertionError`` if conflicting buffers overlap or an offset is misaligned."""
    for b in buffers:
        off = offsets[b.name]
        assert off >= 0 and off % constraints.alignment == 0, f"{b.name}: bad offset {off}"
    adj = conflicts(buffers, constraints)
    for i, nbrs in enumerate(adj):
        a = buffers[i]
        for j in nbrs:
            if j < i:
                continue
            b = buffers[j]
            oa, ob = offsets[a.name], offsets[b.name]
            assert oa + a.size <= ob or ob + b.size <= oa, (
                f"{a.name} [{oa}, {oa + a.size}) overlaps {b.name} [{ob}, {ob + b.size}) while both live")


# ----- placement -----------------------------------------------------------------------------

def _place(buffers: list[Buffer], order: list[int], adj: list[set[int]], alignment: int) -> dict[str, int]:
    """Visit buffers in ``order``; put each in the smallest gap among already placed conflicting
    buffers that fits (best fit), else on top of them."""
    offsets: dict[int, int] = {}
    for i in order:
        b = buffers[i]
        if b.size == 0:
            offsets[i] = 0
            continue
        placed = sorted((offsets[j], offsets[j] + buffers[j].size) for j in adj[i] if j in offsets)
        prev, best, best_gap = 0, None, None
        for lo, hi in placed:
            start = align_up(prev, alignment)
            gap = lo - start
            if gap >= b.size and (best_gap is None or gap < best_gap):
                best, best_gap = start, gap
            prev = max(prev, hi)
        offsets[i] = best if best is not None else align_up(prev, alignment)
    return {buffers[i].name: off for i, off in offsets.items()}


def greedy_by_size(buffers: list[Buffer], constraints: Constraints, adj=None) -> dict[str, int]:
    adj = adj if adj is not None else conflicts(buffers, constraints)
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, i))
    return _place(buffers, order, adj, constraints.alignment)


def greedy_by_breadth(buffers: list[Buffer], constraints: Constraints, adj=None) -> dict[str, int]:
    """Steps by decreasing breadth (bytes live); at each, its unplaced buffers by size."""
    adj = adj if adj is not None else conflicts(buffers, constraints)
    breadth = live_bytes(buffers, constraints)
    at_step: dict[int, list[int]] = {}
    for i, b in enumerate(buffers):
        for s, e in b.spans:
            for t in range(s, e + 1):
                at_step.setdefault(t, []).append(i)
    order, seen = [], set()
    for t in sorted(range(len(breadth)), key=lambda t: (-breadth[t], t)):
        for i in sorted(at_step.get(t, ()), key=lambda i: (-buffers[i].size, i)):
            if i not in seen:
                seen.add(i)
                order.append(i)
    order += [i for i in range(len(buffers)) if i not in seen]
    return _place(buffers, order, adj, constraints.alignment)


def _best_fit(key):
    def algo(buffers: list[Buffer], constraints: Constraints, adj=None) -> dict[str, int]:
        adj = adj if adj is not None else conflicts(buffers, constraints)
        order = sorted(range(len(buffers)), key=lambda i: key(buffers[i]) + (buffers[i].first, i))
        return _place(buffers, order, adj, constraints.alignment)
    return algo


# XLA heap simulator sort keys: spatial (size, then length), temporal (length, then size), area.
best_fit_spatial = _best_fit(lambda b: (-b.size, -b.length))
best_fit_temporal = _best_fit(lambda b: (-b.length, -b.size))
best_fit_area = _best_fit(lambda b: (-b.size * b.length, -b.size))


def naive(buffers: list[Buffer], constraints: Constraints, adj=None) -> dict[str, int]:
    """Every buffer its own bytes, stacked in order: the ``memory="off"`` baseline."""
    offsets, top = {}, 0
    for b in buffers:
        offsets[b.name] = top
        top = align_up(top + b.size, constraints.alignment)
    return offsets


def exact(buffers: list[Buffer], constraints: Constraints, adj=None, hint=None) -> dict[str, int] | None:
    """Offsets from the exact solver, or None when no solver is installed or none is found in time."""
    solved = _exact(buffers, constraints, adj, hint)
    return None if solved is None else solved[0]


def _exact(buffers, constraints, adj=None, hint=None):
    from .exact import solve_exact
    adj = adj if adj is not None else conflicts(buffers, constraints)
    return solve_exact(buffers, constraints, adj, hint)


ALGORITHMS: dict[str, Callable] = {
    "greedy_by_size": greedy_by_size,
    "greedy_by_breadth": greedy_by_breadth,
    "best_fit_spatial": best_fit_spatial,
    "best_fit_temporal": best_fit_temporal,
    "best_fit_area": best_fit_area,
    "exact": exact,
    "naive": naive,
}
DEFAULT_ALGORITHMS = ("greedy_by_size", "greedy_by_breadth", "best_fit_spatial", "best_fit_temporal",
                      "best_fit_area", "exact")


def plan(buffers: list[Buffer], constraints: Constraints = Constraints(),
         algorithms: Iterable[str] = DEFAULT_ALGORITHMS) -> Assignment:
    """Run ``algorithms``, check every result, keep the smallest arena (first wins ties).

    ``exact`` runs last, seeded with the best heuristic result, and only when that result is
    not already provably minimal and there are at most ``constraints.exact_max_buffers`` buffers.
    """
    names = list(dict.fromkeys(algorithms))
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown memory planning algorithm(s) {unknown}; known: {sorted(ALGORITHMS)}")
    if len({b.name for b in buffers}) != len(buffers):
        raise ValueError("buffer names must be unique")
    adj = conflicts(buffers, constraints)
    floor = align_up(lower_bound(buffers, constraints), constraints.alignment)
    best: Assignment | None = None
    candidates: dict[str, int] = {}
    for name in [a for a in names if a != "exact"] + (["exact"] if "exact" in names else []):
        if name == "exact":
            if best is not None and best.arena_bytes <= floor:
                continue
            if len([b for b in buffers if b.size]) > constraints.exact_max_buffers:
                continue
            solved = _exact(buffers, constraints, adj, hint=best.offsets if best else None)
            if solved is None:
                continue
            offsets, proven = solved
        else:
            offsets = ALGORITHMS[name](buffers, constraints, adj)
        check_assignment(buffers, offsets, constraints)
        arena = arena_of(buffers, offsets, constraints.alignment)
        candidates[name] = arena
        if best is None or arena < best.arena_bytes:
            best = Assignment(dict(offsets), arena, name, optimal=name == "exact" and proven)
    if best is None:
        best = Assignment({}, 0, "none")
    best.candidates = candidates
    best.optimal = best.optimal or best.arena_bytes <= floor
    return best
