"""The order floor: a peak that no execution order can go below, computed without trying orders.

Whatever the topological order, when node ``X`` runs these bytes are live at its step:

- the buffers ``X`` reads (its non-input, non-constant inputs, views resolved to their source)
  and the buffers it writes;
- every buffer made by an ancestor of ``X`` and read by a descendant of ``X`` (or pinned: a graph
  output, an ``external`` tensor): the ancestor runs before ``X`` and the reader after it;
- every ``exclusive`` buffer (live at every step).

In-place can merge two of them into one buffer only at ``X`` itself: output 0 of ``X`` may take
over an input buffer that no descendant of ``X`` reads (a buffer merged in place at an ancestor
``Y`` died at ``Y``, so it cannot also be read after ``X``). The floor therefore subtracts the
output's bytes when ``X`` has such an in-place candidate. The maximum over nodes is a lower bound
on the peak (``Lifetimes.lower_bound_bytes``) of every topological order: when the default
order's peak equals it, the default order is optimal, and ``tight`` need not search.

Lifetime overrides and reuse groups depend on step numbers, so with them the floor is ``None``
(unknown). Views and in-place follow ``aliasing.py``; nothing here mutates the graph.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph
from .aliasing import inplace_candidates, view_source
from .lifetime import LifetimeOptions, value_bytes


@dataclass(frozen=True)
class OrderFloor:
    bytes: int          # no order's peak is below this
    node: str | None    # a node whose step forces it ("" for an empty graph)
    live: tuple[str, ...] = ()  # the buffers (root value names) counted at that node


def order_floor(graph: Graph, options: LifetimeOptions = LifetimeOptions()) -> OrderFloor | None:
    """The floor of ``graph`` under ``options``: None with lifetime overrides, reuse groups or a
    stream release hook (they depend on step numbers or on a given order)."""
    if options.tensor_lifetimes or options.reuse_groups or options.release_after is not None:
        return None
    nodes = list(graph.nodes)
    n = len(nodes)
    if n == 0:
        return OrderFloor(0, "")
    index = {id(x): i for i, x in enumerate(nodes)}
    root: dict[int, object] = {}     # id(value) -> root Value (None: a graph input or constant)
    size: dict[int, int] = {}        # id(root) -> bytes
    name: dict[int, str] = {}
    producer: dict[int, int] = {}
    readers: dict[int, int] = {}     # id(root) -> bitset of reading nodes
    ins: list[list[int]] = [[] for _ in range(n)]
    outs: list[list[int]] = [[] for _ in range(n)]
    preds: list[int] = [0] * n
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v is None or v.is_const or v.producer is None or id(v.producer) not in index:
                continue
            preds[i] |= 1 << index[id(v.producer)]
            r = root.get(id(v))
            if r is not None and id(r) not in ins[i]:
                ins[i].append(id(r))
                readers[id(r)] |= 1 << i
        src = view_source(node) if options.views else None
        for k, o in enumerate(node.outputs):
            s = node.inputs[src] if src is not None and k == 0 else None
            if s is not None:
                root[id(o)] = root.get(id(s)) if not s.is_const and s.producer is not None else None
                continue
            root[id(o)] = o
            size[id(o)] = value_bytes(o) or 0
            name[id(o)] = o.name
            producer[id(o)] = i
            readers[id(o)] = 0
            outs[i].append(id(o))
    anc = [0] * n
    for i in range(n):
        a = preds[i]
        for p in _bits(preds[i]):
            a |= anc[p]
        anc[i] = a
    desc = [0] * n
    for i in reversed(range(n)):
        for p in _bits(preds[i]):
            desc[p] |= desc[i] | (1 << i)
    by_name: dict[str, int] = {}   # value name (and ONNX alias) -> id(root)
    for node in nodes:
        for o in node.outputs:
            r = root.get(id(o))
            if r is not None:
                by_name[o.name] = id(r)
                by_name.setdefault(o.meta.get("onnx_name") or o.name, id(r))
    pinned = {id(root[id(v)]) for v in graph.outputs if root.get(id(v)) is not None}
    pinned |= {by_name[nm] for nm in options.external_tensors if nm in by_name}
    exclusive = {by_name[nm] for nm in options.exclusive_tensors if nm in by_name}

    live: list[set[int]] = [set(ins[i]) | set(outs[i]) for i in range(n)]
    for r, p in producer.items():
        if r in pinned:
            cross = desc[p]
        else:
            after = 0
            for z in _bits(readers[r]):
                after |= anc[z]
            cross = desc[p] & after
        for x in _bits(cross):
            live[x].add(r)
    best, best_node, best_live = -1, None, ()
    for i, node in enumerate(nodes):
        total = sum(size[r] for r in live[i]) + sum(size[r] for r in exclusive if r not in live[i])
        total -= _inplace_saving(node, i, root, size, readers, desc, pinned, options)
        if total > best:
            best, best_node, best_live = total, node.name, tuple(sorted(name[r] for r in live[i]))
    return OrderFloor(best, best_node, best_live)


def _inplace_saving(node, i, root, size, readers, desc, pinned, options) -> int:
    """Output 0's bytes when it may take over an input buffer that no descendant reads (an
    over-estimate of what ``lifetime.py`` allows, which keeps the floor a lower bound)."""
    if not options.inplace or not node.outputs or root.get(id(node.outputs[0])) is not node.outputs[0]:
        return 0
    out = node.outputs[0]
    for k in inplace_candidates(node):
        r = root.get(id(node.inputs[k]))
        if r is None or id(r) in pinned:
            continue
        if size[id(r)] != size[id(out)] or readers[id(r)] & desc[i]:
            continue
        return size[id(out)]
    return 0


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
