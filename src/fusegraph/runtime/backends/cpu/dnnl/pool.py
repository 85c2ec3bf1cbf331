"""MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool as oneDNN pooling primitives.

2-D float32 / bfloat16 pools with static shapes, read and written in the layouts the layout
pass chose, and max pools of uint8 / int8 values (a QDQ model's pools between two int8
convolutions: the largest integer of each window is exact, and oneDNN pads with the type's
lowest value, which never wins over a real one). The ONNX geometry (auto_pad, asymmetric
pads, dilations, ceil mode) comes from the op's own ``PoolGeometry``: oneDNN's end padding
is the one the last window reaches, and padded positions never count for max, nor
(``count_include_pad`` 0) in an average's divisor.
An average with ``count_include_pad`` whose last window overhangs the explicit pads (ceil
mode) declines: ONNX counts the explicit pads there but not the overhang.

oneDNN's max pool turns NaN into a number and a window of -inf into -FLT_MAX. Exact (the
default), the kernel checks that its input's sum is finite after each call (one read of the
input: no NaN, no infinity; an overflowing sum only sends the call down the exact path too)
and otherwise recomputes the node with the op's own kernel (torch's NaN-propagating pool)
into the same output. ``Config.fast_math`` drops the check.
"""
from __future__ import annotations

import math

import torch

from .....ops.pool import PoolGeometry
from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from ..threading_policy import threads_for
from .capi import Dims
from .layouts import channels_last, contiguous, dtype_of, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create

TYPES = (torch.float32, torch.bfloat16)
INTEGER_MAX_TYPES = (torch.uint8, torch.int8)


def _geometry(ctx, kind: str, xs, ys):
    op = ctx.node.op_type
    if op.startswith("Global"):
        k = list(xs[2:])
        return k, [1, 1], [0, 0], [0, 0], [0, 0]
    geo = PoolGeometry(ctx)
    if len(geo.kernel) != 2:
        return None
    out, begin, end, cover = geo.resolve(tuple(xs[2:]))
    if list(out) != list(ys[2:]) or min(begin) < 0:
        return None
    if kind == "avg" and int(ctx.attr("count_include_pad", 0)) and any(c > e for c, e in zip(cover, end)):
        return None
    right = [max(0, c) for c in cover]       # the last window's end: oneDNN's output size follows from it
    return list(geo.kernel), list(geo.strides), [d - 1 for d in geo.dil], list(begin), right


def pool_kernel(ctx, opdef, resources, exact: bool = True):
    node = ctx.node
    kind = "max" if "Max" in node.op_type else "avg"
    if len(node.outputs) > 1:
        return Decline("MaxPool with indices", "dnnl")
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    dtype = dtype_of(x_v)
    if xs is None or ys is None or len(xs) != 4 or not (dtype in TYPES or (kind == "max" and dtype in INTEGER_MAX_TYPES)):
        return Decline("needs a 2-D float32 / bfloat16 pool, or a uint8 / int8 max pool, with static shapes", "dnnl")
    if kind == "avg" and _whole_image(ctx, xs, ys):   # GlobalAveragePool, or an AveragePool over the image
        return _global_mean(x_v, y_v, xs, ys, dtype, resources)
    geo = _geometry(ctx, kind, xs, ys)
    if geo is None:
        return Decline("a pool geometry oneDNN does not express exactly", "dnnl")
    kernel, strides, dil, begin, end = geo
    if kind == "max":
        alg = capi.POOLING_MAX
    else:
        alg = capi.POOLING_AVG_INCLUDE if int(ctx.attr("count_include_pad", 0)) else capi.POOLING_AVG_EXCLUDE
    x_md = MemDesc.of(xs, dtype, strides_of(x_v))
    y_md = MemDesc.of(ys, dtype, strides_of(y_v))
    lib = capi.load()
    attr = Attr()
    try:
        prim = create("pooling", lambda pd: lib.pooling_forward_primitive_desc_create(
            pd, lib.engine, capi.FORWARD_INFERENCE, alg, x_md.handle, y_md.handle, Dims(*strides),
            Dims(*kernel), Dims(*dil), Dims(*begin), Dims(*end), attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no pooling for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference pooling ({prim.impl})", "dnnl")
    after = _exact_max(opdef.build(ctx)) if kind == "max" and exact and dtype in TYPES else None
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, strides_of(x_v), dtype, x_md)],
                      Slot(capi.ARG_DST, ys, strides_of(y_v), dtype, y_md), [], resources, (0,), after=after)


def _exact_max(portable):
    """After oneDNN's max pool: when the input holds a NaN or an infinity, the op's own kernel
    (which propagates NaN and keeps -inf) recomputes the result into the same output."""
    def check(y, inputs):
        x = inputs[0]
        if not math.isfinite(float(x.sum())):
            y.copy_(portable(x))
    return check


def _whole_image(ctx, xs, ys) -> bool:
    """One undilated window covering the whole image, one output pixel: the mean of the image
    when no padded position counts in the divisor (``count_include_pad`` 0, or no explicit
    pads: ONNX counts explicit pads, never what a window overhangs)."""
    if ctx.node.op_type == "GlobalAveragePool":
        return True
    if any(d != 1 for d in ys[2:]) or (ctx.attr("auto_pad", "NOTSET") or "NOTSET") not in ("NOTSET", "VALID"):
        return False
    n = len(xs) - 2
    kernel = [int(k) for k in ctx.attr("kernel_shape", None) or []]
    pads = [int(p) for p in ctx.attr("pads", None) or [0] * (2 * n)]
    dil = [int(d) for d in ctx.attr("dilations", None) or [1] * n]
    if ctx.attr("auto_pad", "NOTSET") == "VALID":
        pads = [0] * (2 * n)
    if len(kernel) != n or len(pads) != 2 * n or any(d != 1 for d in dil):
        return False
    covers = all(k - pads[i] >= x for i, (k, x) in enumerate(zip(kernel, xs[2:])))
    return covers and (not int(ctx.attr("count_include_pad", 0)) or not any(pads))


def _global_mean(x_v, y_v, xs, ys, dtype, resources):
    """The mean over the image as one oneDNN matmul, summed in float32 and scaled by ``1 / HW``
    (an ``eltwise linear`` post-op, in float32: a bfloat16 ``1 / HW`` would be off by up to
    0.4 %) before the one rounding (oneDNN's pooling with a window as large as the input, and
    its spatial reduction, have no fast implementation here): channels-last images are a row
    of ones times each image's ``[HW, C]`` pixels, NCHW ones each image's ``[C, HW]`` rows times
    a column of ones (the ones broadcast over the batch)."""
    n, c, h, w = xs
    hw = h * w
    x_st, y_st = strides_of(x_v), strides_of(y_v)
    last = x_st == channels_last(xs)
    if not (last or x_st == contiguous(xs)) or y_st not in (contiguous(ys), channels_last(ys)):
        return Decline("needs a dense NCHW or channels-last image and output", "dnnl")
    ones = torch.ones(hw, dtype=dtype)
    if last:                      # [1, 1, HW] x [N, HW, C] -> [N, 1, C]
        ones_md, x_md, y_md = (MemDesc.of((1, 1, hw), dtype), MemDesc.of((n, hw, c), dtype),
                               MemDesc.of((n, 1, c), dtype))
        a_md, b_md, x_arg, ones_arg = ones_md, x_md, capi.ARG_WEIGHTS, capi.ARG_SRC
    else:                         # [N, C, HW] x [1, HW, 1] -> [N, C, 1]
        ones_md, x_md, y_md = (MemDesc.of((1, hw, 1), dtype), MemDesc.of((n, c, hw), dtype),
                               MemDesc.of((n, c, 1), dtype))
        a_md, b_md, x_arg, ones_arg = x_md, ones_md, capi.ARG_SRC, capi.ARG_WEIGHTS
    lib = capi.load()
    attr = Attr([("eltwise", "linear", 1.0 / hw, 0.0)])
    with threads_for(True):
        try:
            prim = create("matmul", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, a_md.handle, b_md.handle, None, y_md.handle, attr.handle))
        except capi.DnnlError as exc:
            return Decline(f"oneDNN has no matmul for this mean: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference matmul for this mean ({prim.impl})", "dnnl")
    consts = [(ones_arg, Memory(ones_md, ones.data_ptr()))]
    return DnnlKernel(prim, [Slot(x_arg, xs, x_st, dtype, x_md)],
                      Slot(capi.ARG_DST, ys, y_st, dtype, y_md), consts, resources, (0,),
                      keep=(ones,))
