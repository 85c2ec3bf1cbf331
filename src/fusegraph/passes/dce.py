"""Dead code elimination: keep what the graph outputs need, drop the rest.

Liveness flows backwards from ``graph.outputs``. A node is also a root (kept, with all it
reads) when its op is impure, unknown to the registry, or when one of its outputs is flagged
``external`` / ``no_fuse``. Unused constants go too, unless flagged. Graph inputs are the
model's interface and always stay. Bodies of control-flow nodes are cleaned the same way
first (their outputs are their roots), and captures no body reads any more are dropped with
the node's implicit inputs, so an outer value only dead body code read can go too.
"""
from __future__ import annotations

from ..ir import Graph
from ..ir.subgraphs import prune_captures, subgraphs
from ..ops import lookup
from .manager import PassResult, is_locked


def _is_root(node) -> bool:
    if any(is_locked(o) for o in node.outputs):
        return True
    opdef = lookup(node.domain, node.op_type, node.version)
    return opdef is None or not opdef.pure


class DeadCodeElimination:
    name = "dce"

    def __init__(self, options=None):
        self.options = options

    def run(self, graph: Graph) -> PassResult:
        in_bodies = 0
        for node in graph.nodes:
            for _, body in subgraphs(node):
                r = self.run(body)
                in_bodies += sum(v for k, v in r.stats.items() if isinstance(v, int))
            in_bodies += prune_captures(node)
        live = {id(v) for v in graph.outputs}
        keep: set[int] = set()
        for node in reversed(graph.nodes):
            if _is_root(node) or any(id(o) in live for o in node.outputs):
                keep.add(id(node))
                live.update(id(v) for v in node.inputs if v is not None)
        dead = [n for n in reversed(graph.nodes) if id(n) not in keep]
        for node in dead:  # users before producers, so every removal is safe
            graph.remove(node)
        unused = [k for k, v in graph.constants.items()
                  if not v.uses and not v.is_graph_output and not is_locked(v)]
        for k in unused:
            del graph.constants[k]
        stats = {"in_bodies": in_bodies} if in_bodies else {}
        if dead:
            stats["nodes_removed"] = len(dead)
        if unused:
            stats["constants_removed"] = len(unused)
        return PassResult(bool(dead or unused or in_bodies), stats)
