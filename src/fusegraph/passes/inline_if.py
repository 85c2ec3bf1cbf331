"""Inlining the taken branch of an ``If`` whose condition is a constant.

Called by constant folding (``fold.py``) for each ``If`` node: the branch's constants become
constants of the enclosing graph, its nodes are copied in front of the ``If`` (their bodies,
if any, move with them; their implicit inputs follow the branch's captures to the node's
outer values) and the ``If``'s outputs are replaced by the branch's. Declined (returns a
reason) when the condition is not a one-element constant, an output is locked, or two graph
outputs would end up as one value.
"""
from __future__ import annotations

from ..ir import Graph, Node
from ..ir.subgraphs import implicit_count
from .manager import is_locked


def inline_constant_if(graph: Graph, node: Node) -> str | None:
    """Inline ``node``'s taken branch; None when done, else why not."""
    cond = node.input(0)
    if cond is None or not cond.is_const or cond.const.numel() != 1:
        return "condition is not a one-element constant"
    if any(is_locked(o) for o in node.outputs):
        return "an output is flagged external/no_fuse"
    taken = bool(cond.const.reshape(()).item())
    branch = node.attrs.get("then_branch" if taken else "else_branch")
    if not isinstance(branch, Graph) or len(branch.outputs) != len(node.outputs) or branch.inputs:
        return "malformed branch"
    k = implicit_count(node)
    mapping = {id(c): v for c, v in zip(branch.captures, node.inputs[len(node.inputs) - k:])}
    srcs = [mapping.get(id(b)) for b in branch.outputs]   # outer values returned as they are
    outer_outs = [s for s, o in zip(srcs, node.outputs) if s is not None and o.is_graph_output]
    if any(s.is_graph_output or s.is_graph_input or s.is_const for s in outer_outs) or \
            len({id(s) for s in outer_outs}) != len(outer_outs):
        return "a graph output would become another graph value"
    for c in branch.constants.values():
        mapping[id(c)] = graph.add_constant(c.name, c.const)
    for bn in branch.nodes:
        new = graph.add_node(bn.op_type, [None if v is None else mapping[id(v)] for v in bn.inputs],
                             outputs=[o.name for o in bn.outputs], attrs=dict(bn.attrs), domain=bn.domain,
                             version=bn.version, name=bn.name, before=node)
        new.meta.update(bn.meta)
        for old, out in zip(bn.outputs, new.outputs):
            out.dtype, out.shape, out.layout = old.dtype, old.shape, old.layout
            out.meta.update(old.meta)
            mapping[id(old)] = out
    for out, b in zip(node.outputs, branch.outputs):
        src = mapping[id(b)]
        if "onnx_name" in out.meta:
            src.meta.setdefault("onnx_name", out.meta["onnx_name"])
        out.replace_all_uses_with(src)
    graph.remove(node)
    return None
