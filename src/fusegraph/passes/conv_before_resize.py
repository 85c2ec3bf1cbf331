"""A pointwise convolution over a channel concatenation of upsampled maps runs at the maps'
own resolution: ``Conv1x1(Concat(Resize(a), Resize(b), c)) -> Resize(Conv1x1(a, W_a)) +
Resize(Conv1x1(b, W_b)) + Conv1x1(c, W_c, bias)``.

A segmentation head's fuse step (SegFormer's all-MLP decoder, DeepLab's ASPP with its pooled
branch) upsamples every stage's features to one resolution, concatenates them and mixes the
channels with a 1x1 convolution. A 1x1 convolution mixes channels at each pixel; ``Resize``
interpolates each channel over space with the same weights (nearest, linear and cubic are
linear maps per channel), so the two commute, and a convolution over a concatenation is the
sum of the convolutions over its parts by their slices of the weight. Each upsampled part's
share of the product then runs on its source's pixels, not the output's: the head's largest
product shrinks by the upsampling factor of every part.

Condition: the convolution pointwise (every kernel dim 1, strides 1, no padding, one group)
with a constant weight (and bias); its input a ``Concat`` over channels used only by it, of
parts with static shapes; at least one part a ``Resize`` used only by the concatenation that
upsamples (more output pixels than input ones), keeps batch and channels (a factor of
exactly 1 there, or sizes that keep them), stretches
(``keep_aspect_ratio_policy`` stretch), is not ``tf_crop_and_resize`` (whose extrapolation
value makes it affine, not linear) and whose scales or sizes are constants; and the
convolution's output channels at most that part's channels (the interpolation then touches no
more values than before). The bias is added once, at the output's resolution, by a part that
is not resized or by an ``Add`` of its own. Equal up to rounding for finite values (the
channel sums are regrouped); a NaN reaches the same pixels in both orders.
"""
from __future__ import annotations

import math

import torch

from .facts import const_of, only_use, producer
from .rule import Decline, Rule

MODES = ("nearest", "linear", "cubic")


def _pointwise(conv) -> bool:
    a = conv.attrs
    w = const_of(conv.input(1))
    return (w is not None and w.dim() >= 3 and all(k == 1 for k in w.shape[2:])
            and int(a.get("group", 1)) == 1 and all(int(s) == 1 for s in a.get("strides", [1]))
            and all(int(p) == 0 for p in a.get("pads", [0])) and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"))


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _upsampling(part, out_channels: int):
    """The ``Resize`` producing ``part`` when it may run after the convolution, else None."""
    resize = producer(part, "Resize")
    if resize is None or resize.version < 11 or not only_use(part):
        return None
    a = resize.attrs
    src, dst = resize.inputs[0].shape, part.shape
    if not (_static(src) and _static(dst)) or src[:2] != dst[:2] or math.prod(dst[2:]) <= math.prod(src[2:]):
        return None
    if a.get("mode", "nearest") not in MODES or a.get("coordinate_transformation_mode") == "tf_crop_and_resize" \
            or a.get("keep_aspect_ratio_policy", "stretch") != "stretch" or out_channels > src[1]:
        return None
    scales, sizes = resize.input(2), resize.input(3)
    if (scales is not None and const_of(scales) is None) or (sizes is not None and const_of(sizes) is None):
        return None
    factors = const_of(scales)
    if factors is not None and factors.numel():
        if any(axis in (0, 1) and float(f) != 1.0
               for axis, f in zip(_resized_axes(resize, len(src)), factors.reshape(-1).tolist())):
            return None       # a batch or channel factor other than 1 interpolates across channels
    return resize


def _check(conv, ctx):
    concat = producer(conv.inputs[0], "Concat")
    y = conv.outputs[0]
    if concat is None or not _pointwise(conv) or not y.dtype.is_float or not _static(y.shape):
        return None
    if int(concat.attrs.get("axis", 0)) not in (1, 1 - len(y.shape)):
        return None
    if not only_use(conv.inputs[0]):
        return Decline("the concatenation has other users")
    if any(p is None or not _static(p.shape) for p in concat.inputs):
        return Decline("a concatenated part has no static shape")
    if conv.input(2) is not None and const_of(conv.input(2)) is None:
        return Decline("the bias is not a constant")
    resizes = [_upsampling(p, y.shape[1]) for p in concat.inputs]
    if not any(resizes):
        return Decline("no part is an upsampling Resize that may run after the convolution")
    return concat, resizes


def _resized_axes(resize, rank: int) -> list[int]:
    """The axes a resize's scales / sizes entries are for (its ``axes``, opset 18+; else all)."""
    axes = resize.attrs.get("axes") if resize.version >= 18 else None
    return list(range(rank)) if axes is None else [int(a) % rank for a in axes]


def _sizes(resize, channels: int, rank: int) -> torch.Tensor:
    """The resize's constant ``sizes`` with the channel entry set to ``channels``."""
    sizes = const_of(resize.input(3)).clone()
    axes = _resized_axes(resize, rank)
    if 1 in axes:
        sizes[axes.index(1)] = channels
    return sizes


def _rewrite(conv, match, ctx):
    concat, resizes = match
    w, b = const_of(conv.input(1)), const_of(conv.input(2)) if conv.input(2) is not None else None
    attrs = {k: v for k, v in conv.attrs.items() if k != "auto_pad"}
    out_channels, rank = w.shape[0], len(conv.outputs[0].shape)
    resized, direct = [], []
    start = 0
    for i, (part, resize) in enumerate(zip(concat.inputs, resizes)):
        width = part.shape[1]
        w_part = ctx.const(w[:, start:start + width], f"weight_{i}")
        start += width
        if resize is None:
            direct.append((part, w_part))
            continue
        small = ctx.emit("Conv", [resize.inputs[0], w_part], dict(attrs))
        inputs = [small, *resize.inputs[1:]]
        if resize.input(3) is not None:
            inputs[3] = ctx.const(_sizes(resize, out_channels, rank), f"sizes_{i}")
        resized.append(ctx.emit("Resize", inputs, dict(resize.attrs)))
    total = resized[0]
    for term in resized[1:]:
        total = ctx.emit("Add", [total, term])
    for j, (part, w_part) in enumerate(direct):       # last, so a fusion can sum onto the resized parts
        bias = [ctx.const(b, "bias")] if b is not None and j == 0 else []
        total = ctx.emit("Add", [ctx.emit("Conv", [part, w_part, *bias], dict(attrs)), total])
    if b is not None and not direct:
        total = ctx.emit("Add", [total, ctx.const(b.reshape((-1,) + (1,) * (rank - 2)), "bias")])
    return total


RULES = [Rule("conv_before_resize", _check, _rewrite, ops=("Conv",),
              doc="pointwise conv with constant weights over a channel Concat used once, with an "
                  "upsampling linear-per-channel Resize part used once; output channels <= its channels")]
