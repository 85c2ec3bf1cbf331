"""Collapse consecutive Reshapes, Transposes and Casts where the result is exactly the same.

- reshape_reshape: ``Reshape(R(x), s) -> Reshape(x, s)`` where R is a Reshape, Flatten,
  Squeeze or Unsqueeze (all keep row-major element order), when ``s`` is a constant with no
  0 entry (0 copies a dim of the *input*, which changes) or, failing that, the output shape
  is static and becomes the new target.
- transpose_transpose: ``Transpose(Transpose(x, p), q) -> Transpose(x, p∘q)``, removed
  entirely when the composition is the identity.
- cast_cast: ``Cast(Cast(x, T1), T2) -> Cast(x, T2)`` when T1 holds every value of x's
  type exactly (a widening), so the first cast loses nothing; removed when T2 is x's type.

The inner node stays when it has other users (a reshape chain is then left as it is: both
are views, so collapsing it would save nothing, and the head merge after an attention is
recognised on the chain as written).
"""
from __future__ import annotations

import torch

from ..ir import DType
from ..ir.shape import is_static
from .facts import ints_arg, producer
from .rule import Decline, Rule

D = DType
_MANTISSA = {D.FLOAT16: 11, D.BFLOAT16: 8, D.FLOAT: 24, D.DOUBLE: 53}
_FLOAT_WIDENINGS = {(D.FLOAT16, D.FLOAT), (D.FLOAT16, D.DOUBLE), (D.BFLOAT16, D.FLOAT),
                    (D.BFLOAT16, D.DOUBLE), (D.FLOAT, D.DOUBLE)}
# (signed, value bits): the type holds [-2^bits, 2^bits) when signed, else [0, 2^bits)
_INTS = {D.BOOL: (False, 1), D.UINT8: (False, 8), D.INT8: (True, 7), D.UINT16: (False, 16),
         D.INT16: (True, 15), D.UINT32: (False, 32), D.INT32: (True, 31), D.UINT64: (False, 64),
         D.INT64: (True, 63)}


def widens_exactly(src: DType, dst: DType) -> bool:
    """Every value of ``src`` is exactly representable in ``dst``."""
    if src == dst:
        return True
    if src in _MANTISSA:
        return (src, dst) in _FLOAT_WIDENINGS
    if src not in _INTS:
        return False
    signed, bits = _INTS[src]
    if dst in _MANTISSA:
        return bits <= _MANTISSA[dst]
    if dst not in _INTS:
        return False
    dsigned, dbits = _INTS[dst]
    return dbits >= bits and (dsigned or not signed)


def _reshape_reshape(node, ctx):
    inner = producer(node.inputs[0], "Reshape", "Flatten", "Squeeze", "Unsqueeze")
    if inner is None or node.version < 5:
        return None
    if len(node.inputs[0].uses) > 1 or node.inputs[0].is_graph_output:
        return Decline("the inner reshape is read elsewhere: it would stay, and both are views")
    known, spec = ints_arg(node, 1, "shape", 5)
    if known and spec is not None and 0 not in spec:
        return inner.inputs[0], None
    shape = node.outputs[0].shape
    if is_static(shape):
        return inner.inputs[0], list(shape)
    return Decline("target shape has 0 entries (or is not constant) and the output shape is not static")


def _reshape_rewrite(node, match, ctx):
    x, spec = match
    shape = node.inputs[1] if spec is None else ctx.const(torch.tensor(spec, dtype=torch.int64), "shape")
    attrs = {k: v for k, v in node.attrs.items() if k == "allowzero"}
    return ctx.emit("Reshape", [x, shape], attrs)


def _perm(node):
    p = node.attrs.get("perm")
    shape = node.inputs[0].shape
    if p is None:
        return None if shape is None else list(range(len(shape)))[::-1]
    rank = len(p)
    return [int(a) + rank if int(a) < 0 else int(a) for a in p]


def _transpose_transpose(node, ctx):
    inner = producer(node.inputs[0], "Transpose")
    if inner is None:
        return None
    p, q = _perm(inner), _perm(node)
    if p is None or q is None or len(p) != len(q):
        return Decline("permutation unknown")
    combined = [p[k] for k in q]
    x = inner.inputs[0]
    if combined == list(range(len(combined))) and x.is_graph_output and node.outputs[0].is_graph_output:
        return Decline("would make two graph outputs the same tensor")
    return x, combined


def _transpose_rewrite(node, match, ctx):
    x, perm = match
    if perm == list(range(len(perm))):
        return x
    return ctx.emit("Transpose", [x], {"perm": perm})


def _cast_cast(node, ctx):
    inner = producer(node.inputs[0], "Cast")
    if inner is None:
        return None
    x = inner.inputs[0]
    mid = node.inputs[0].dtype
    if x.dtype == DType.UNDEFINED or not widens_exactly(x.dtype, mid):
        return Decline(f"{x.dtype.name} -> {mid.name} is not exact")
    if DType(node.attrs["to"]) == x.dtype and x.is_graph_output and node.outputs[0].is_graph_output:
        return Decline("would make two graph outputs the same tensor")
    return x


def _cast_rewrite(node, x, ctx):
    if DType(node.attrs["to"]) == x.dtype:
        return x
    return ctx.emit("Cast", [x], dict(node.attrs))


RULES = [
    Rule("reshape_reshape", _reshape_reshape, _reshape_rewrite, ops=("Reshape",),
         doc="outer target has no 0 entry, or output shape static"),
    Rule("transpose_transpose", _transpose_transpose, _transpose_rewrite, ops=("Transpose",), doc="always"),
    Rule("cast_cast", _cast_cast, _cast_rewrite, ops=("Cast",), doc="first cast widens exactly"),
]
