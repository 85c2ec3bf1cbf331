"""Helpers shared by op families: inference shorthands and attribute/constant readers.

Inference functions take a ``NodeContext`` and return one ``(dtype, shape)`` per output;
``None`` for either means "unknown" and leaves the frontend's hint in place.
"""
from __future__ import annotations

from ..ir import DType
from ..ir.shape import broadcast_shapes
from .registry import NodeContext


def same_as_input(i: int = 0):
    """Output 0 has input ``i``'s dtype and shape (unary elementwise ops)."""
    def infer(ctx: NodeContext):
        return [(ctx.dtype(i) or None, ctx.shape(i))]
    return infer


def product_out_dtype(ctx: NodeContext):
    """The output type of a product (Linear, LinearAct, FusedConv) or a layer norm that
    computes in its inputs' type: its ``out_dtype`` attribute (a Cast folded in,
    ``passes/fold_casts.py``), else input 0's."""
    given = out_dtype_attr(ctx)
    return given if given is not None else (ctx.dtype(0) or None)


OUT_DTYPES = (DType.FLOAT, DType.BFLOAT16, DType.FLOAT16)


def out_dtype_attr(ctx: NodeContext) -> DType | None:
    """The node's ``out_dtype`` attribute, a float type (None without one); anything else (an
    artifact's) is refused naming the node."""
    given = ctx.attr("out_dtype", None)
    if given is None:
        return None
    try:
        dtype = DType(int(given))
    except (TypeError, ValueError):
        dtype = None
    if dtype not in OUT_DTYPES:
        raise ctx.unsupported(f"out_dtype {given!r} is not a float type ({', '.join(d.name for d in OUT_DTYPES)})")
    return dtype


def rounding_to_out_dtype(ctx: NodeContext):
    """A norm's float32 result -> its ``out_dtype`` (a Cast folded in: rounded once)."""
    given = out_dtype_attr(ctx)
    if given is None:
        return lambda y: y
    dtype = given.to_torch()
    return lambda y: y.to(dtype)


def widens(ctx: NodeContext) -> bool:
    """Whether a product's kernel computes on float32 copies of its operands: a float32 output
    of a reduced product (``out_dtype``), its products unrounded."""
    return ctx.attr("out_dtype", None) is not None


def widened(*tensors):
    """``tensors`` as float32 (None stays None)."""
    return tuple(None if t is None else t.float() for t in tensors)


def bias_like(b, x):
    """A product's bias in its input's type: a reduced product keeps its constant bias float32
    (``passes/precision_policy.FLOAT32_BIAS``, for kernels adding it to a float32
    accumulator); ATen's products take one type, the bias rounded to it."""
    return b if b is None or b.dtype == x.dtype else b.to(x.dtype)


def broadcast_of_inputs(dtype: DType | None = None, dtype_from: int = 0):
    """Output 0 is the broadcast of all inputs; dtype fixed or taken from input ``dtype_from``."""
    def infer(ctx: NodeContext):
        shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has_input(i)]
        return [(dtype or ctx.dtype(dtype_from) or None, broadcast_shapes(*shapes))]
    return infer


def const_ints(ctx: NodeContext, i: int) -> list[int] | None:
    """A constant integer input as a Python list (None when absent or not constant)."""
    t = ctx.const(i)
    return None if t is None else [int(x) for x in t.reshape(-1).tolist()]


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis
