"""Offset assignment into one arena: ``plan(buffers, constraints) -> Assignment``.

A ``Buffer`` is a name, a byte size and one or more inclusive step spans (several spans when a
reuse group merged tensors into one slot). Two buffers *conflict* when a span of one meets a
span of the other, or when either is exclusive; conflicting buffers must not overlap in the
arena. Every algorithm has the same signature ``(buffers, constraints) -> {name: offset}``;
``plan`` runs the requested ones, checks each result, and keeps the smallest arena.

Algorithms: ``greedy_by_size`` and ``greedy_by_breadth`` (Pisarchyk & Lee 2020, best-fit gap
among time-overlapping buffers), ``best_fit_spatial`` / ``best_fit_temporal`` / ``best_fit_area``
(XLA heap-simulator style: decreasing-size best fit over live intervals with XLA's sort keys),
``best_fit_size_class`` (power-of-two size classes, latest death first),
``exact`` (CP-SAT or MILP with a time limit, see ``exact.py``) and ``naive`` (no sharing: the
``memory="off"`` baseline). Offsets are multiples of ``constraints.alignment``.

Pure data in, pure data out: nothing here knows the graph.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np


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
                     constraints: Constraints = Constraints(), adj: list[set[int]] | None = None) -> None:
    """Raise ``AssertionError`` if conflicting buffers overlap or an offset is misaligned."""
    for b in buffers:
        off = offsets[b.name]
        if off < 0 or off % constraints.alignment:
            raise AssertionError(f"{b.name}: offset {off} is negative or not a multiple of {constraints.alignment}")
    adj = adj if adj is not None else conflicts(buffers, constraints)
    size = np.array([b.size for b in buffers], dtype=np.int64)
    off = np.array([offsets[b.name] for b in buffers], dtype=np.int64)
    for i, nb in enumerate(_neighbours(adj)):
        nb = nb[nb > i]
        bad = nb[(off[i] < off[nb] + size[nb]) & (off[nb] < off[i] + size[i])]
        if bad.size:
            a, b = buffers[i], buffers[int(bad[0])]
            oa, ob = offsets[a.name], offsets[b.name]
            raise AssertionError(f"{a.name} [{oa}, {oa + a.size}) overlaps {b.name} [{ob}, {ob + b.size}) "
                                 f"while both live")


# ----- placement -----------------------------------------------------------------------------

def _neighbours(adj: list[set[int]]) -> list[np.ndarray]:
    return [np.fromiter(a, dtype=np.int64, count=len(a)) for a in adj]


def _place(buffers: list[Buffer], order: list[int], adj: list[set[int]], alignment: int) -> dict[str, int]:
    """Visit buffers in ``order``; put each in the smallest gap among already placed conflicting
    buffers that fits (best fit, lowest offset on ties), else on top of them."""
    size = np.array([b.size for b in buffers], dtype=np.int64)
    off = np.full(len(buffers), -1, dtype=np.int64)
    nbrs = _neighbours(adj)
    a = max(1, alignment)
    for i in order:
        s = size[i]
        nb = nbrs[i]
        nb = nb[off[nb] >= 0] if nb.size else nb
        if s == 0 or nb.size == 0:
            off[i] = 0
            continue
        lo = off[nb]
        k = np.argsort(lo, kind="stable")
        lo = lo[k]
        ends = np.maximum.accumulate(lo + size[nb][k])
        start = -(-np.concatenate(([0], ends[:-1])) // a) * a   # aligned end of everything below
        gap = lo - start
        fits = gap >= s
        if fits.any():
            off[i] = start[np.argmin(np.where(fits, gap, np.iinfo(np.int64).max))]
        else:
            off[i] = -(-int(ends[-1]) // a) * a
    return {b.name: int(off[i]) for i, b in enumerate(buffers)}


def greedy_by_size(buffers: list[Buffer], constraints: Constraints, adj=None) -> dict[str, int]:
    adj = adj if adj is not None else conflicts(buffers, constraints)
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, i))
    return _place(buffers, order, adj, constraints.alignment)


def greedy_by_breadth(buffers: list[Buffer], constraints: Constraints, adj=None) -> dict[str, int]:
    """Steps by decreasing breadth (bytes live); at each, its unplaced buffers by size."""
    adj = adj if adj is not None else conflicts(buffers, constraints)
    breadth = live_bytes(buffers, constraints)
    steps = sorted(range(len(breadth)), key=lambda t: (-breadth[t], t))
    rank = np.empty(len(breadth), dtype=np.int64)
    rank[steps] = np.arange(len(steps))
    first_seen = [min((int(rank[a:b + 1].min()) for a, b in x.spans), default=0) for x in buffers]
    order = sorted(range(len(buffers)), key=lambda i: (first_seen[i], -buffers[i].size, i))
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
# size classes (powers of two), latest death first within a class: long-lived buffers go low, so
# a staircase of buffers born together and dying one by one leaves no holes below the others
best_fit_size_class = _best_fit(lambda b: (-b.size.bit_length(), -b.last, -b.size))


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
    "best_fit_size_class": best_fit_size_class,
    "exact": exact,
    "naive": naive,
}
DEFAULT_ALGORITHMS = ("greedy_by_size", "greedy_by_breadth", "best_fit_spatial", "best_fit_temporal",
                      "best_fit_area", "best_fit_size_class", "exact")
# the heuristics alone: plans made while a model runs (``buckets.py``), in milliseconds
FAST_ALGORITHMS = tuple(a for a in DEFAULT_ALGORITHMS if a != "exact")


def plan(buffers: list[Buffer], constraints: Constraints = Constraints(),
         algorithms: Iterable[str] = DEFAULT_ALGORITHMS) -> Assignment:
    """Run ``algorithms``, check every result, keep the smallest arena (first wins ties); stop
    at the first result at the lower bound (``candidates`` lists the ones run).

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
        check_assignment(buffers, offsets, constraints, adj)
        arena = arena_of(buffers, offsets, constraints.alignment)
        candidates[name] = arena
        if best is None or arena < best.arena_bytes:
            best = Assignment(dict(offsets), arena, name)
        if name == "exact" and proven and arena <= best.arena_bytes:
            best.optimal = True
        if best.arena_bytes <= floor:
            break                     # at the lower bound: no algorithm after it can do better
    if best is None:
        best = Assignment({}, 0, "none")
    best.candidates = candidates
    best.optimal = best.optimal or best.arena_bytes <= floor
    return best
