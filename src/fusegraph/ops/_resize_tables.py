"""Resize's per-axis tables: where each output sample reads (source indices) and with which
weights, for every coordinate_transformation_mode / nearest_mode / cubic / antialias /
exclude_outside / tf_crop_and_resize combination, plus the output geometry (scales, sizes,
keep_aspect_ratio_policy, axes). Pure functions on the CPU; ``resize.py`` holds the kernels.
"""
from __future__ import annotations

import math

import torch

from .common import normalize_axis


class Opts:
    __slots__ = ("mode", "coord", "nearest", "cubic_a", "exclude", "extrap", "antialias", "axes", "policy")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


# ---------------------------------------------------------------- per-axis tables (float64, CPU)

def _source_coords(o: Opts, out_w_int: int, scale: float, in_w: int, roi_pair):
    """Source coordinate of every output index, float64, computed with Python floats in the
    spec's operation order so that floor / tie decisions match it bit for bit."""
    out_w = scale * in_w
    ys = range(out_w_int)
    extrap = None
    if o.coord == "align_corners":
        xs = [0.0] * out_w_int if out_w == 1 else [y * (in_w - 1) / (out_w - 1) for y in ys]
    elif o.coord == "asymmetric":
        xs = [y / scale for y in ys]
    elif o.coord == "tf_crop_and_resize":
        r0, r1 = roi_pair  # 0-d tensors in the roi's own dtype, as the spec's arithmetic runs
        span = float(r1 - r0)
        if out_w == 1:
            xs = [float((r1 - r0) * (in_w - 1) / 2)] * out_w_int
        else:
            xs = [y * span * (in_w - 1) / (out_w - 1) for y in ys]
        start = float(r0 * (in_w - 1))
        xs = [x + start for x in xs]
        extrap = torch.tensor([x < 0 or x > in_w - 1 for x in xs], dtype=torch.bool, device="cpu")
    elif o.coord == "pytorch_half_pixel":
        xs = [-0.5] * out_w_int if out_w == 1 else [(y + 0.5) / scale - 0.5 for y in ys]
    elif o.coord == "half_pixel_symmetric":
        adjustment = out_w_int / out_w
        offset = in_w / 2 * (1 - adjustment)
        xs = [offset + (y + 0.5) / scale - 0.5 for y in ys]
    else:
        xs = [(y + 0.5) / scale - 0.5 for y in ys]
    return torch.tensor(xs, dtype=torch.float64, device="cpu"), extrap


def _cubic(x, a):
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x <= 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _weights(o: Opts, ratio, scale):
    """[out, taps] weights for fractional offsets ``ratio`` in (0, 1]."""
    r = ratio.unsqueeze(1)
    if o.mode == "linear" and not o.antialias:
        return torch.cat([1 - r, r], dim=1)
    if o.mode == "cubic" and not o.antialias:
        offs = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64, device="cpu")
        return _cubic(offs - r, o.cubic_a)
    s = min(scale, 1.0)
    support = 1 if o.mode == "linear" else 2
    start = int(math.floor(-support / s) + 1)
    offs = torch.arange(start, 2 - start, dtype=torch.float64, device="cpu")
    args = (offs - r) * s
    w = (1 - args.abs()).clamp(0, 1) if o.mode == "linear" else _cubic(args, o.cubic_a)
    return w / w.sum(dim=1, keepdim=True)


def _nearest_index(o: Opts, x, scale):
    fl = torch.floor(x)
    ratio = x - fl
    mode = o.nearest
    if mode == "simple":
        mode = "ceil" if scale < 1 else "floor"
    if mode == "round_prefer_floor":
        up = ratio > 0.5
    elif mode == "round_prefer_ceil":
        up = ratio >= 0.5
    elif mode == "floor":
        up = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        up = ratio > 0
    return torch.where(up, fl + 1, fl).long()


def axis_table(o: Opts, in_w: int, out_w: int, scale: float, roi_pair):
    """(indices [out, taps] long, weights [out, taps] float64 or None, extrapolated [out] or None)."""
    x, extrap = _source_coords(o, out_w, scale, in_w, roi_pair)
    if o.mode == "nearest":
        idx = _nearest_index(o, x, scale).clamp(0, max(in_w - 1, 0)).unsqueeze(1)
        return idx, None, extrap
    fl = torch.floor(x)
    exact = x == fl
    ratio = torch.where(exact, torch.ones_like(x), x - fl)  # in (0, 1]: prefer the left pixel
    w = _weights(o, ratio, scale)
    n = w.shape[1]
    base = torch.where(exact, fl - 1, fl).long()  # the tap at offset 0 sits at x - ratio
    idx = base.unsqueeze(1) + torch.arange(1 - n // 2, 1 - n // 2 + n, device="cpu").unsqueeze(0)
    if o.exclude:
        w = torch.where((idx < 0) | (idx >= in_w), torch.zeros_like(w), w)
        total = w.sum(dim=1, keepdim=True)
        w = w / torch.where(total == 0, torch.ones_like(total), total)
    return idx.clamp(0, max(in_w - 1, 0)), w, extrap


# ---------------------------------------------------------------- output size and plan

def output_geometry(o: Opts, in_shape, scales, sizes):
    """(per-dim scale, per-dim output size, resized axes in order)."""
    r = len(in_shape)
    axes = list(range(r)) if o.axes is None else [normalize_axis(a, r) for a in o.axes]
    scale = [1.0] * r
    out = list(in_shape)
    if sizes is not None:
        if len(sizes) != len(axes):
            raise ValueError(f"Resize: {len(sizes)} sizes for {len(axes)} axes")
        for a, s in zip(axes, sizes):
            out[a] = int(s)
            scale[a] = s / in_shape[a] if in_shape[a] else 1.0
        if o.policy in ("not_larger", "not_smaller"):
            pick = min if o.policy == "not_larger" else max
            s = pick(scale[a] for a in axes)
            for a in axes:
                scale[a] = s
                out[a] = int(s * in_shape[a] + 0.5)
    else:
        if scales is None or len(scales) != len(axes):
            raise ValueError("Resize: give one scale per axis, or sizes")
        for a, s in zip(axes, scales):
            scale[a] = float(s)
            out[a] = int(math.floor(s * in_shape[a]))
    return scale, out, axes


def full_roi(roi, axes, r):
    """Per-dim roi as 0-d tensors (``roi`` is a 1-D tensor), or None."""
    if roi is None or roi.numel() == 0:
        return None
    roi = list(roi.reshape(-1).unbind(0))
    if len(roi) == 2 * r and list(axes) == list(range(r)):
        return roi
    zero, one = (torch.tensor(v, dtype=roi[0].dtype, device="cpu") for v in (0.0, 1.0))
    full = [zero] * r + [one] * r
    k = len(axes)
    for i, a in enumerate(axes):
        full[a], full[r + a] = roi[i], roi[k + i]
    return full
