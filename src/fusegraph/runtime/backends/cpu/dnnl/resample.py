"""ONNX ``Resize`` as oneDNN's linear resampling primitive: a bilinear resize of a 2-D image,
float32 or bfloat16, static shapes, NCHW or channels-last, into the planned output.

oneDNN's linear resampling samples source coordinate ``(o + 0.5) * in / out - 0.5`` of each
output pixel ``o`` (below 0 read as 0, past the last pixel as the last), two taps per axis,
in float32 (bfloat16 data is read and rounded once): ONNX's ``linear`` mode with the
``half_pixel`` coordinate transformation (``pytorch_half_pixel`` where every output axis has
more than one pixel, where the two agree), no antialias, nothing excluded, stretched to the
output size. ONNX maps with the scale it is given where it is given one; oneDNN with
``out / in``: a node whose scales are not exactly that declines (the op's own kernel runs it),
as does any other mode, coordinate transformation, a resize of the batch or channel axes, or
an ``axes`` attribute. The op's own kernel (``ops/resize.py``) computes bfloat16 through a
float32 copy; this reads it directly.
"""
from __future__ import annotations

import torch

from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .layouts import channels_last, contiguous, dtype_of, static_shape, strides_of
from .memory import MemDesc
from .primitive import Attr, create

TYPES = (torch.float32, torch.bfloat16)
COORDINATES = ("half_pixel", "pytorch_half_pixel")


def resize_kernel(ctx, resources):
    """The oneDNN kernel of one Resize node, or a ``Decline`` saying why not."""
    node = ctx.node
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    dtype = dtype_of(x_v)
    if xs is None or ys is None or len(xs) != 4 or dtype not in TYPES or y_v.dtype.to_torch() != dtype:
        return Decline("needs a float32 / bfloat16 4-D image with static shapes", "dnnl")
    why = _not_bilinear(ctx, xs, ys)
    if why is not None:
        return Decline(why, "dnnl")
    x_st, y_st = strides_of(x_v), strides_of(y_v)
    if x_st not in (contiguous(xs), channels_last(xs)) or y_st not in (contiguous(ys), channels_last(ys)):
        return Decline("needs a dense NCHW or channels-last image and output", "dnnl")
    x_md, y_md = MemDesc.of(xs, dtype, x_st), MemDesc.of(ys, dtype, y_st)
    lib = capi.load()
    attr = Attr()
    try:
        prim = create("resampling", lambda pd: lib.resampling_forward_primitive_desc_create(
            pd, lib.engine, capi.FORWARD_INFERENCE, capi.RESAMPLING_LINEAR, None, x_md.handle, y_md.handle,
            attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no resampling for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference resampling ({prim.impl})", "dnnl")
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, x_st, dtype, x_md)],
                      Slot(capi.ARG_DST, ys, y_st, dtype, y_md), [], resources, (0,))


def _not_bilinear(ctx, xs, ys) -> str | None:
    """Why this Resize is not oneDNN's linear resampling (None: it is)."""
    if ctx.node.version < 11:
        return "opset 10's Resize maps coordinates asymmetrically"
    if str(ctx.attr("mode", "nearest")) != "linear":
        return "only the linear mode is oneDNN's resampling here"
    coord = str(ctx.attr("coordinate_transformation_mode", "half_pixel"))
    if coord not in COORDINATES or (coord == "pytorch_half_pixel" and min(ys[2:]) < 2):
        return f"coordinate_transformation_mode {coord!r} is not oneDNN's half-pixel mapping"
    if int(ctx.attr("antialias", 0)) or int(ctx.attr("exclude_outside", 0)):
        return "antialias / exclude_outside"
    if ctx.attr("axes", None) is not None or str(ctx.attr("keep_aspect_ratio_policy", "stretch")) != "stretch":
        return "an axes attribute or an aspect-ratio policy"
    if tuple(xs[:2]) != tuple(ys[:2]):
        return "resizes the batch or channel axes"
    scales = ctx.const(2) if ctx.has_input(2) else None
    if scales is not None and scales.numel():
        given = scales.to(torch.float32).reshape(-1)
        ratio = torch.tensor(ys[2:], dtype=torch.float32) / torch.tensor(xs[2:], dtype=torch.float32)
        if given.numel() != 4 or given[:2].tolist() != [1.0, 1.0] or not torch.equal(given[2:], ratio):
            return "scales that are not the output size over the input's (ONNX maps with the scale given)"
    elif not (ctx.has_input(3) and ctx.const(3) is not None):
        return "no constant scales or sizes"
    return None
