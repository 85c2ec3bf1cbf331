"""Execution orders: the default (the graph's node order) and memory-aware topological orders.

``memory="tight"`` tries several orders and keeps the one whose peak (the lower bound of the
arena, computed by the caller's ``score``) is smallest; the default order wins ties:

- ``dfs_*``: post-order DFS from the sinks, visiting a node's producers largest-output first,
  smallest first, in input order, or heaviest subtree first (Sethi-Ullman style);
- ``greedy``: list scheduling that always runs the ready node that grows live memory least;
- ``serenity``: the dynamic program of Serenity (Ahn et al. 2020) over sets of scheduled nodes,
  split at cut nodes (every other node is an ancestor or a descendant), beam-capped per segment;
  ``serenity_lazy`` leaves free nodes out of the DP (smaller states when many free nodes make
  weights, as in unfolded graphs) and inserts them before their first consumer;
- ``exhaustive``: the best of the above, refined by trying every order of each small segment,
  scored with the real lower bound (``exhaustive.py``; only when the caller passes ``live``).

*Free* nodes (no producer among the graph's nodes: they read only constants and graph inputs)
are scheduled lazily, right before their first consumer, in every order but the default and
``serenity`` (its DP places them, counting their bytes).
``OrderModel`` (``order_model.py``) is the simplified memory model these heuristics use.
When the default order's peak already equals the order floor (``order_bound.py``), no order can beat it and ``tight`` keeps it without searching.
Nothing here mutates the graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ir import Graph, Node
from .order_model import OrderModel


def default_order(graph: Graph) -> list[Node]:
    return list(graph.nodes)


def check_order(graph: Graph, order: list[Node]) -> None:
    """Raise ``ValueError`` unless ``order`` is a topological permutation of ``graph.nodes``."""
    ids = {id(n) for n in graph.nodes}
    if len(order) != len(graph.nodes) or {id(n) for n in order} != ids:
        raise ValueError(f"order is not a permutation of the {len(graph.nodes)} nodes of {graph.name}")
    done: set[int] = set()
    for n in order:
        for v in n.inputs:
            if v is not None and v.producer is not None and id(v.producer) in ids and id(v.producer) not in done:
                raise ValueError(f"order runs {n.name} before its producer {v.producer.name}")
        done.add(id(n))


def _sinks(m: OrderModel) -> list[int]:
    return [i for i in range(len(m.nodes)) if not m.succs[i] and not m.free[i]]


def dfs_order(m: OrderModel, key: Callable[[int], object] | None) -> list[Node]:
    """Iterative post-order DFS from the sinks; producers visited in ``sorted(preds, key)``."""
    seen: set[int] = set()
    core: list[int] = []
    for sink in _sinks(m):
        if sink in seen:
            continue
        stack = [(sink, False)]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                core.append(i)
                continue
            if i in seen:
                continue
            seen.add(i)
            stack.append((i, True))
            preds = [p for p in m.preds[i] if not m.free[p] and p not in seen]
            if key is not None:
                preds.sort(key=key)
            stack.extend((p, False) for p in reversed(preds))
    return m.with_free_nodes(core)


def _subtree_need(m: OrderModel) -> list[int]:
    """Sethi-Ullman-style peak estimate per node (trees exact, DAGs approximate)."""
    need = [0] * len(m.nodes)
    for i in range(len(m.nodes)):
        preds = sorted((p for p in m.preds[i] if not m.free[p]), key=lambda p: -(need[p] - m.out_bytes[p]))
        held, peak = 0, 0
        for p in preds:
            peak = max(peak, held + need[p])
            held += m.out_bytes[p]
        need[i] = max(peak, held + m.out_bytes[i])
    return need


def greedy_order(m: OrderModel) -> list[Node]:
    """Run next the ready node with the smallest (allocated - freed) bytes; default order breaks ties."""
    n = len(m.nodes)
    waiting = [sum(1 for p in m.preds[i] if not m.free[p]) for i in range(n)]
    ready = {i for i in range(n) if not m.free[i] and waiting[i] == 0}
    done_mask = sum(1 << i for i in range(n) if m.free[i])
    core: list[int] = []
    while ready:
        best = min(ready, key=lambda i: (m.out_bytes[i] - m.freed_by(i, done_mask | (1 << i)), i))
        ready.discard(best)
        core.append(best)
        done_mask |= 1 << best
        for s in m.succs[best]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.add(s)
    return m.with_free_nodes(core)


def simulated_peak(m: OrderModel, order: list[Node]) -> int:
    """Peak of ``OrderModel``'s simplified accounting for a full order (for quick comparisons)."""
    index = {id(x): i for i, x in enumerate(m.nodes)}
    live = peak = 0
    done = 0
    for node in order:
        i = index[id(node)]
        done |= 1 << i
        live += m.out_bytes[i]
        peak = max(peak, live)
        live -= m.freed_by(i, done)
    return peak


@dataclass
class OrderChoice:
    name: str
    order: list[Node]
    scores: dict[str, int] = field(default_factory=dict)  # candidate -> score (peak bytes)


def candidate_orders(graph: Graph, dp_state_limit: int = 1000,
                     dp_budget: int = 200_000) -> dict[str, list[Node]]:
    m = OrderModel(graph)
    need = _subtree_need(m)
    orders = {
        "default": default_order(graph),
        "dfs_large_first": dfs_order(m, lambda p: (-m.out_bytes[p], p)),
        "dfs_small_first": dfs_order(m, lambda p: (m.out_bytes[p], p)),
        "dfs_input_order": dfs_order(m, None),
        "dfs_heavy_first": dfs_order(m, lambda p: (-(need[p] - m.out_bytes[p]), p)),
        "greedy": greedy_order(m),
    }
    from .serenity import serenity_order
    orders["serenity"] = serenity_order(m, state_limit=dp_state_limit, budget=dp_budget)
    if any(m.free):  # without free nodes the lazy variant is the same DP
        orders["serenity_lazy"] = serenity_order(m, state_limit=dp_state_limit, budget=dp_budget,
                                                 lazy_free=True)
    for name, order in orders.items():
        check_order(graph, order)
    return orders


def choose_order(graph: Graph, score: Callable[[list[Node]], int], mode: str = "balanced",
                 dp_state_limit: int = 1000, floor: int | None = None,
                 live: Callable[[list[Node]], list[int]] | None = None) -> OrderChoice:
    """``balanced`` / ``off``: the default order. ``tight``: the candidate with the lowest score,
    unless the default order's score already equals ``floor`` (``order_bound.order_floor``: no
    order can score lower), which proves it optimal and skips the search. With ``live`` (bytes
    live per step of an order, the real model behind ``score``), small segments are also
    searched exhaustively (``exhaustive.py``): candidate ``exhaustive`` when every segment was,
    ``exhaustive_partial`` otherwise."""
    order = default_order(graph)
    if mode != "tight":
        return OrderChoice("default", order, {"default": score(order)})
    first = score(order)
    if floor is not None and first <= floor:
        return OrderChoice("default", order, {"default": first})
    orders = candidate_orders(graph, dp_state_limit)
    scores = {name: (first if name == "default" else score(o)) for name, o in orders.items()}
    best = min(scores, key=lambda k: (scores[k], k != "default"))
    if live is not None:
        from .exhaustive import exhaustive_order
        searched, exact = exhaustive_order(OrderModel(graph), live, base=orders[best])
        check_order(graph, searched)
        name = "exhaustive" if exact else "exhaustive_partial"
        orders[name], scores[name] = searched, score(searched)
        best = min(scores, key=lambda k: (scores[k], k != "default"))
    return OrderChoice(best, orders[best], scores)
