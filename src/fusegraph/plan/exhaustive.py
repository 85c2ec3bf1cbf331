"""Exhaustive ordering by segments: every topological order of each small segment, scored with
the real lower bound (views and in-place included), not the simplified ``OrderModel``.

The graph splits at cut nodes (``order_model.cut_segments``; free nodes join the segment of their
first consumer), and every topological order is a concatenation of one order per segment, each
segment at fixed positions (up to free nodes run earlier, which never lowers a peak). Which order a segment runs in changes the bytes live at its own
steps only: a buffer crossing into or out of it keeps its life elsewhere, and an in-place
takeover inside it merges two buffers whose lives meet there. So each segment is chosen alone,
by the peak over its own steps (others fixed), and the peak of the result is the maximum of the
segments' minima: optimal when every segment was enumerated. A segment with more than
``per_segment`` orders, or past the ``work`` budget, keeps the order a base order (the best
other candidate) gives it; the result then says ``exact=False``. The caller scores the result
like any candidate, so a wrong independence assumption could cost the candidate, never the
plan. Nothing here mutates the graph.
"""
from __future__ import annotations

from typing import Callable

from ..ir import Node
from .order_model import OrderModel, cut_segments, free_nodes_joined


def _topological_orders(m: OrderModel, seg: list[int], limit: int) -> list[list[int]]:
    """Up to ``limit`` topological orders of ``seg`` (its outside producers have all run);
    an explicit stack, so long segments cannot exhaust Python's recursion limit."""
    inside = set(seg)
    need = {i: {p for p in m.preds[i] if p in inside} for i in seg}
    found: list[list[int]] = []
    prefix: list[int] = []
    done: set[int] = set()

    def ready() -> list[int]:
        return [i for i in seg if i not in done and need[i] <= done]

    stack = [ready()]  # per depth: the choices not tried yet
    while stack and len(found) < limit:
        choices = stack[-1]
        if len(prefix) == len(seg):
            found.append(list(prefix))
        if not choices or len(prefix) == len(seg):
            stack.pop()
            if prefix:
                done.discard(prefix.pop())
            continue
        i = choices.pop(0)
        done.add(i)
        prefix.append(i)
        stack.append(ready())
    return found


def exhaustive_order(m: OrderModel, live: Callable[[list[Node]], list[int]],
                     base: list[Node] | None = None, per_segment: int = 120,
                     work: int = 100_000) -> tuple[list[Node], bool]:
    """(order, exact): ``live(order)`` gives the bytes live at each step of a full order.

    Segments start in the order ``base`` runs their nodes (default: the graph's order), so
    segments left unsearched keep that order. ``work`` bounds the orders scored times the
    number of nodes (each score is a full lifetime analysis)."""
    core = [i for i in range(len(m.nodes)) if not m.free[i]]
    segments = free_nodes_joined(m, cut_segments(m, core))
    if base is not None:
        rank = {id(n): k for k, n in enumerate(base)}
        segments = [sorted(seg, key=lambda i: rank[id(m.nodes[i])]) for seg in segments]
    order = [i for seg in segments for i in seg]
    budget = work // max(1, len(order))
    exact, scored, lo = True, 0, 0
    for seg in segments:
        hi = lo + len(seg)
        if len(seg) > 1:
            options = _topological_orders(m, seg, per_segment + 1)
            if len(options) > per_segment or scored + len(options) > budget:
                exact = False
            else:
                best = None
                for option in options:
                    steps = live([m.nodes[i] for i in order[:lo] + option + order[hi:]])
                    scored += 1
                    local = max(steps[lo:hi], default=0)
                    if best is None or local < best[0]:
                        best = (local, option)
                order[lo:hi] = best[1]
        lo = hi
    return [m.nodes[i] for i in order], exact
