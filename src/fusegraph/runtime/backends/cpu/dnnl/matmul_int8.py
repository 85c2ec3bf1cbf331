"""``fusegraph::QMatMul`` (``Q(DQ(a) @ DQ(b))`` of two quantised activations: a QDQ
transformer's attention scores and weighted sum) as one oneDNN int8 matmul.

``a`` is the source (uint8 / int8, its zero point a source zero point), ``b`` the weights,
given at run time. oneDNN's int8 matmul takes int8 weights only: a uint8 ``b`` is moved into
int8 by flipping its top bit (``b - 128``, exact) into this thread's buffer, and its zero
point lowered by 128 to match, so ``(a - a_zp) @ (b - b_zp)`` is the same integer sum. The
sum is exact in int32, then scaled by ``a_scale * b_scale``, divided by the output scale,
rounded half to even, the output zero point added and saturated: within one quantisation step
of the reference, which sums the dequantised float32 products (its order of summation moves
the last bit of the sum; the int8 kernels of ``linear_int8.py`` make the same trade). With
``y_grid`` a float32 output on that grid (``int8_support.grid_post_ops``). Only on
a CPU whose int8 kernels sum exactly (``int8_support.int8_exact``; elsewhere ``int8_float.py``).

Static shapes of one rank (batch dims broadcast as oneDNN's matmul broadcasts them), row-major
operands and output; anything else declines with the reason and the op's own kernel runs.
"""
from __future__ import annotations

import math

import torch

from .....ir import DType
from .....ops.quantized import QUANTISED, y_grid
from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .int8_support import NOT_EXACT, QuantArgs, epilogue_bound, grid_declines, grid_post_ops, int8_exact
from .layouts import contiguous, static_shape, strides_of
from .memory import MemDesc
from .primitive import Attr, create

FLIP = -128          # the top bit as an int8: x ^ FLIP moves a uint8 x to the int8 x - 128


def qmatmul_operands(ctx):
    """(output type, whether it is on a grid, the static shapes of a, b and the output, the
    operands' types) of QMatMul node ``ctx`` as a kernel takes them (also ``int8_float.py``'s
    float32 form), or a ``Decline`` saying why not."""
    out_type = DType(int(ctx.attr("y_type", int(DType.UINT8))))
    why = grid_declines(ctx, out_type)
    if why is not None:
        return why
    on_grid = y_grid(ctx) is not None
    if out_type not in QUANTISED and not on_grid:
        return Decline(f"an output of type {out_type.name}", "dnnl")
    node = ctx.node
    (a_v, b_v), y_v = node.inputs[:2], node.outputs[0]
    shapes = [static_shape(v) for v in (a_v, b_v, y_v)]
    if any(s is None or len(s) < 2 for s in shapes) or len({len(s) for s in shapes}) != 1:
        return Decline("needs static operands and output of one rank (2 or more)", "dnnl")
    if any(strides_of(v) != contiguous(s) for v, s in zip((a_v, b_v, y_v), shapes)):
        return Decline("needs row-major operands and output", "dnnl")
    types = [ctx.dtype(i) for i in (0, 1)]
    if any(t not in QUANTISED for t in types):
        return Decline(f"operands of types {[t.name if t else None for t in types]} (uint8 / int8)", "dnnl")
    return out_type, on_grid, shapes, types


def qmatmul_kernel(ctx, resources):
    """The oneDNN kernel of one QMatMul node, or a ``Decline`` saying why not."""
    if not int8_exact():
        return Decline(NOT_EXACT, "dnnl")
    got = qmatmul_operands(ctx)
    if isinstance(got, Decline):
        return got
    out_type, on_grid, shapes, types = got
    a_shape, b_shape, y_shape = shapes
    flip = types[1] == DType.UINT8
    b_zero = int(ctx.attr("b_zero_point", 0)) + (FLIP if flip else 0)
    a_scale, b_scale = float(ctx.attr("a_scale")), float(ctx.attr("b_scale"))
    q = QuantArgs()
    q.scales(capi.ARG_SRC, [a_scale])
    q.scales(capi.ARG_WEIGHTS, [b_scale])
    scales = {capi.ARG_SRC: 0, capi.ARG_WEIGHTS: 0}
    grid = grid_post_ops(ctx, len(y_shape), 0,
                         epilogue_bound(a_shape[-1], a_scale, torch.tensor([b_scale]), w_range=255))
    if isinstance(grid, Decline):
        return grid
    post, grid_args, grid_keep = grid
    if not on_grid:
        q.scales(capi.ARG_DST, [float(ctx.attr("y_scale"))])
        scales[capi.ARG_DST] = 0
    zero_points = {}
    for arg, zp in ((capi.ARG_SRC, int(ctx.attr("a_zero_point", 0))), (capi.ARG_WEIGHTS, b_zero),
                    (capi.ARG_DST, 0 if on_grid else int(ctx.attr("y_zero_point", 0)))):
        if zp:
            zero_points[arg] = 0
            q.zero_point(arg, zp)
    attr = Attr(post, scales=scales, zero_points=zero_points)
    a_dtype, y_dtype = types[0].to_torch(), out_type.to_torch()
    a_md, b_md, y_md = MemDesc.of(a_shape, a_dtype), MemDesc.of(b_shape, torch.int8), MemDesc.of(y_shape, y_dtype)
    lib = capi.load()
    try:
        prim = create("int8 matmul of activations", lambda pd: lib.matmul_primitive_desc_create(
            pd, lib.engine, a_md.handle, b_md.handle, None, y_md.handle, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no int8 matmul for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference int8 matmul ({prim.impl})", "dnnl")
    kernel = DnnlKernel(prim, [Slot(capi.ARG_SRC, a_shape, contiguous(a_shape), a_dtype, a_md),
                               Slot(capi.ARG_WEIGHTS, b_shape, contiguous(b_shape), torch.int8, b_md)],
                        Slot(capi.ARG_DST, y_shape, contiguous(y_shape), y_dtype, y_md), q.args + grid_args,
                        resources, (0, 1), keep=(attr, *q.keep, *grid_keep))
    return FlippedWeights(kernel, b_shape, resources) if flip else kernel


class FlippedWeights:
    """A QMatMul kernel whose uint8 ``b`` moves into int8 (``b ^ FLIP``) in this thread's
    buffer, past the primitive's scratchpad, before the matmul reads it."""
    writes_out = True

    def __init__(self, kernel: DnnlKernel, shape: tuple, resources):
        self.kernel, self.shape, self.resources = kernel, tuple(shape), resources
        self.impl = kernel.impl
        self._at = -(-kernel.prim.scratchpad_bytes // 64) * 64
        self._bytes = math.prod(self.shape)
        resources.need(self._at + self._bytes)

    def __call__(self, a, b, out=None):
        flipped = self.resources.temporary(self._at, self._bytes).view(torch.int8).view(self.shape)
        torch.bitwise_xor(b.contiguous().view(torch.int8), FLIP, out=flipped)
        return self.kernel(a, flipped, out=out)
