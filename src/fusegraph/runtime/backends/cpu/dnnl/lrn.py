"""LRN (across channels) as a oneDNN primitive.

ONNX: ``y = x / (bias + alpha / size * sum(x^2 over the channel window))^beta`` with the
window ``[c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]``: oneDNN's across-channels LRN
computes the same with ``k = bias``, for odd sizes (its window is centred; an even size
declines). A NaN propagates and a window whose sum of squares overflows gives 0, as the ONNX
definition does. 4-D float32 / bfloat16 inputs of static shape, in the layout chosen for
them.
"""
from __future__ import annotations

import torch

from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .layouts import dtype_of, static_shape, strides_of
from .memory import MemDesc
from .primitive import Attr, create

TYPES = (torch.float32, torch.bfloat16)


def lrn_kernel(ctx, resources):
    node = ctx.node
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs = static_shape(x_v)
    dtype = dtype_of(x_v)
    size = int(ctx.attr("size"))
    if xs is None or len(xs) != 4 or dtype not in TYPES or static_shape(y_v) != xs:
        return Decline("needs a 4-D float32 / bfloat16 input of static shape", "dnnl")
    if size % 2 == 0:
        return Decline(f"an even window ({size}): oneDNN's window is centred", "dnnl")
    alpha, beta, bias = (float(ctx.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    x_md = MemDesc.of(xs, dtype, strides_of(x_v))
    y_md = MemDesc.of(xs, dtype, strides_of(y_v))
    lib = capi.load()
    attr = Attr()
    try:
        prim = create("lrn", lambda pd: lib.lrn_forward_primitive_desc_create(
            pd, lib.engine, capi.FORWARD_INFERENCE, capi.LRN_ACROSS_CHANNELS, x_md.handle, y_md.handle,
            size, alpha, beta, bias, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no LRN for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference LRN ({prim.impl})", "dnnl")
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, strides_of(x_v), dtype, x_md)],
                      Slot(capi.ARG_DST, xs, strides_of(y_v), dtype, y_md), [], resources, (0,))
