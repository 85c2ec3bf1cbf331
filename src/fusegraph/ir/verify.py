"""``verify_graph``: the IR's invariants, checked with messages that say how to fix them.

Checks single definition, topological order, use-def consistency, defined outputs and, when
an ``infer`` callback (from the op registry) is given, each node's output dtypes and shapes.
Bodies (graph attributes) are checked the same way, recursively; a node's bodies must agree
on their number of captures, which its trailing inputs supply (``subgraphs.py``).
"""
from __future__ import annotations

from ..errors import VerifyError
from .graph import Graph
from .nodes import Node
from .printer import format_node
from .shape import dims_equal
from .subgraphs import subgraphs

_MAX_NESTING = 16


def _context(graph: Graph, index: int, radius: int = 2) -> str:
    lo, hi = max(0, index - radius), min(len(graph.nodes), index + radius + 1)
    lines = []
    for i in range(lo, hi):
        mark = ">>" if i == index else "  "
        lines.append(f"{mark}{format_node(graph.nodes[i])}")
    return "\n".join(lines)


def _fail(graph: Graph, index: int | None, msg: str, hint: str) -> VerifyError:
    ctx = "" if index is None else "\n" + _context(graph, index)
    return VerifyError(f"graph {graph.name!r}: {msg}{ctx}\nhow to fix: {hint}")


def _check_bodies(graph: Graph, idx: int, node: Node, infer, level: int) -> None:
    bodies = list(subgraphs(node))
    if not bodies:
        return
    if level >= _MAX_NESTING:
        raise _fail(graph, idx, f"{node.name} nests bodies deeper than {_MAX_NESTING} levels",
                    "flatten the control flow")
    counts = {len(g.captures) for _, g in bodies}
    if len(counts) != 1 or counts.pop() > len(node.inputs):
        raise _fail(graph, idx, f"the bodies of {node.name} disagree on their captures, or capture "
                    f"more values than the node's {len(node.inputs)} inputs supply",
                    "give every body of a node the same captures, bound to its trailing inputs")
    for attr, g in bodies:
        try:
            verify_graph(g, infer, level + 1)
        except VerifyError as exc:
            raise VerifyError(f"in body {attr!r} of node {node.name!r}: {exc}") from None


def verify_graph(graph: Graph, infer=None, level: int = 0) -> None:
    defined: dict[str, object] = {}
    for v in list(graph.captures) + list(graph.inputs) + list(graph.constants.values()):
        if v.name in defined:
            raise _fail(graph, None, f"value %{v.name} is defined twice",
                        "give every input and constant a unique name (Graph.fresh_name)")
        defined[v.name] = v
    for idx, node in enumerate(graph.nodes):
        if node.graph is not graph:
            raise _fail(graph, idx, f"node {node.name} does not belong to this graph",
                        "create nodes with Graph.add_node")
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if defined.get(v.name) is not v:
                where = "later in the node list" if v.producer in graph.nodes else "nowhere in this graph"
                raise _fail(graph, idx, f"input {i} (%{v.name}) of {node.name} is defined {where}",
                            "insert new nodes before their users (add_node(before=...)) or call "
                            "graph.toposort()")
            if not any(n is node and k == i for n, k in v.uses):
                raise _fail(graph, idx, f"use-def link missing: {node.name} input {i} -> %{v.name}",
                            "rewire inputs with Node.set_input, never by editing lists")
        for k, out in enumerate(node.outputs):
            if out.name in defined:
                raise _fail(graph, idx, f"value %{out.name} is defined twice",
                            "make new values with Graph.new_value")
            if out.producer is not node or out.index != k:
                raise _fail(graph, idx, f"%{out.name} does not record {node.name} as its producer",
                            "create outputs through Graph.add_node")
            defined[out.name] = out
        _check_bodies(graph, idx, node, infer, level)
    for v in defined.values():
        for n, i in v.uses:
            if n.graph is not graph or i >= len(n.inputs) or n.inputs[i] is not v:
                raise _fail(graph, None, f"stale use of %{v.name} by {n.name}",
                            "remove nodes with Graph.remove, which drops their uses")
    for o in graph.outputs:
        if defined.get(o.name) is not o:
            raise _fail(graph, None, f"graph output %{o.name} is not defined",
                        "point outputs at defined values (Value.replace_all_uses_with)")
    if infer is not None:
        for idx, node in enumerate(graph.nodes):
            _check_types(graph, idx, node, infer)


def _check_types(graph: Graph, idx: int, node: Node, infer) -> None:
    inferred = infer(node)
    if inferred is None:
        return
    for out, (dtype, shape) in zip(node.outputs, inferred):
        if dtype is not None and out.dtype and dtype != out.dtype:
            raise _fail(graph, idx, f"%{out.name} is recorded as {out.dtype.name} but {node.op_type} "
                        f"yields {dtype.name}", "re-run shape inference after rewriting")
        if shape is None or out.shape is None:
            continue
        if len(shape) != len(out.shape) or any(dims_equal(a, b) is False for a, b in zip(shape, out.shape)):
            raise _fail(graph, idx, f"%{out.name} is recorded as shape {list(out.shape)} but "
                        f"{node.op_type} yields {list(shape)}", "re-run shape inference after rewriting")
