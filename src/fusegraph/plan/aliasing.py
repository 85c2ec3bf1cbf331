"""Per-op aliasing facts the planner needs: which ops are views, which may write in place.

A *view* op's output shares its source input's memory (same bytes, another shape), so the
planner gives it no buffer and extends the source's life instead. An *in-place candidate* is
an input whose buffer output 0 may overwrite: the op is elementwise (``FusionKind.ELEMENTWISE``
or ``BROADCAST``, or declares ``OpDef.inplace`` pairs, whose input must then feed no other
input of the node: a convolution accumulating onto its residual must not be reading that
buffer as its input too) and that input has exactly output 0's shape, dtype and memory
layout (``Value.layout``). Whether the input actually dies at that
node is decided in ``lifetime.py``.

Both facts come from the op registry: ``OpDef.alias`` ((input, output) view pairs; Reshape,
Flatten, Squeeze, Unsqueeze and Identity declare ``((0, 0),)``) and ``OpDef.inplace`` / the
fusion kind. Unknown ops are treated conservatively: no view, no in-place.
"""
from __future__ import annotations

from ..ir import Node
from ..ir.shape import is_static
from ..ops.registry import view_input

def view_source(node: Node) -> int | None:
    """Input index that output 0 of ``node`` is a view of, or None when it is not a view."""
    return view_input(node)


def _opdef(node: Node):
    try:
        from ..ops.registry import lookup
    except ImportError:  # pragma: no cover - the registry is part of the package
        return None
    return lookup(node.domain, node.op_type, node.version)


def inplace_candidates(node: Node, symbolic: bool = False) -> list[int]:
    """Input indices whose buffer output 0 may take over (same shape and dtype), best first.
    ``symbolic``: shapes may hold named symbolic dims (a plan for a range of input shapes): the
    same name is the same size at run time, so equal shapes stay equal at every shape."""
    if not node.outputs:
        return []
    opdef = _opdef(node)
    if opdef is None:
        return []
    out = node.outputs[0]
    if opdef.inplace:    # a declared pair of a non-elementwise op: the input must be read there only
        allowed = [i for i, o in opdef.inplace if o == 0
                   and sum(1 for v in node.inputs if v is not None and v is node.input(i)) == 1]
    elif opdef.fusion.value in ("elementwise", "broadcast") and len(node.outputs) == 1:
        allowed = list(range(len(node.inputs)))
    else:
        return []
    if not (is_static(out.shape) or (symbolic and out.shape is not None and None not in out.shape)):
        return []
    found = []
    for i in allowed:
        v = node.input(i)
        if v is None or v.is_const or v.dtype != out.dtype or v.shape != out.shape or v.layout != out.layout:
            continue
        found.append(i)
    return found
