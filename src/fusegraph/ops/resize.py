"""Resize (opsets 10-19+) and the deprecated Upsample, after the ONNX spec.

Interpolation is separable: each resized axis gets, once per input shape, a table of source
indices ``[out, taps]`` and weights (nearest: one tap, no weight), computed in float64 exactly
as the spec states (coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
exclude_outside, antialias, tf_crop_and_resize extrapolation, keep_aspect_ratio_policy, axes);
the kernel gathers with ``index_select`` and sums the weighted taps. Where torch's
``interpolate`` computes the same thing (linear / cubic without antialias, half-pixel or
align-corners, trailing spatial axes) the kernel calls it instead.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._tensor_util import DeviceCache, dtype_or_none, runtime_ints
from .common import normalize_axis
from .registry import NodeContext, register

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_PLAN_CACHE_SIZE = 8


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
        extrap = torch.tensor([x < 0 or x > in_w - 1 for x in xs], dtype=torch.bool)
    elif o.coord == "pytorch_half_pixel":
        xs = [-0.5] * out_w_int if out_w == 1 else [(y + 0.5) / scale - 0.5 for y in ys]
    elif o.coord == "half_pixel_symmetric":
        adjustment = out_w_int / out_w
        offset = in_w / 2 * (1 - adjustment)
        xs = [offset + (y + 0.5) / scale - 0.5 for y in ys]
    else:
        xs = [(y + 0.5) / scale - 0.5 for y in ys]
    return torch.tensor(xs, dtype=torch.float64), extrap


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
        offs = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
        return _cubic(offs - r, o.cubic_a)
    s = min(scale, 1.0)
    support = 1 if o.mode == "linear" else 2
    start = int(math.floor(-support / s) + 1)
    offs = torch.arange(start, 2 - start, dtype=torch.float64)
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
    idx = base.unsqueeze(1) + torch.arange(1 - n // 2, 1 - n // 2 + n).unsqueeze(0)
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


def _full_roi(roi, axes, r):
    """Per-dim roi as 0-d tensors (``roi`` is a 1-D tensor), or None."""
    if roi is None or roi.numel() == 0:
        return None
    roi = list(roi.reshape(-1).unbind(0))
    if len(roi) == 2 * r and list(axes) == list(range(r)):
        return roi
    full = [torch.tensor(0.0, dtype=roi[0].dtype)] * r + [torch.tensor(1.0, dtype=roi[0].dtype)] * r
    k = len(axes)
    for i, a in enumerate(axes):
        full[a], full[r + a] = roi[i], roi[k + i]
    return full


def _torch_path(o: Opts, in_shape, scale, out, axes, from_scales):
    """F.interpolate arguments when it computes exactly this resize, else None."""
    r = len(in_shape)
    if o.mode not in ("linear", "cubic") or o.antialias or o.exclude or not 3 <= r <= 5:
        return None
    if out[0] != in_shape[0] or out[1] != in_shape[1] or scale[0] != 1 or scale[1] != 1:
        return None
    if o.mode == "cubic" and (r != 4 or o.cubic_a != -0.75):
        return None
    if o.coord == "align_corners":  # the spec's output width is scale * in, not the rounded size
        align = True
        if any(scale[a] * in_shape[a] != out[a] for a in range(2, r)):
            return None
    elif o.coord == "half_pixel" or (o.coord == "pytorch_half_pixel" and all(d > 1 for d in out[2:])):
        align = False
    else:
        return None
    if o.policy in ("not_larger", "not_smaller") and not from_scales:
        return None
    tmode = "bicubic" if o.mode == "cubic" else {3: "linear", 4: "bilinear", 5: "trilinear"}[r]
    if from_scales and not align:
        return dict(scale_factor=tuple(scale[2:]), mode=tmode, align_corners=align, recompute_scale_factor=False)
    return dict(size=tuple(out[2:]), mode=tmode, align_corners=align)


class Plan:
    __slots__ = ("out", "steps", "interp", "empty")

    def __init__(self, o: Opts, in_shape, scales, sizes, roi):
        scale, out, axes = output_geometry(o, tuple(in_shape), scales, sizes)
        self.out = out
        self.empty = any(d == 0 for d in out)
        full_roi = _full_roi(roi, axes, len(in_shape)) if o.coord == "tf_crop_and_resize" else None
        if o.coord == "tf_crop_and_resize" and full_roi is None:
            raise ValueError("Resize: tf_crop_and_resize needs roi")
        self.interp = None if full_roi is not None else _torch_path(o, in_shape, scale, out, axes,
                                                                    sizes is None)
        self.steps = []
        if self.interp is not None:
            return
        r = len(in_shape)
        for a in axes:
            pair = None if full_roi is None else (full_roi[a], full_roi[a + r])
            if math.isclose(scale[a], 1.0) and out[a] == in_shape[a] and (
                    pair is None or (math.isclose(float(pair[0]), 0.0) and math.isclose(float(pair[1]), 1.0))):
                continue
            idx, w, extrap = axis_table(o, in_shape[a], out[a], scale[a], pair)
            self.steps.append((a, out[a], DeviceCache(idx.reshape(-1), w, extrap)))


def _compute_dtype(dtype):
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def run_plan(plan: Plan, x: torch.Tensor, extrap_value: float) -> torch.Tensor:
    if plan.empty or x.numel() == 0:
        return torch.empty(plan.out, dtype=x.dtype, device=x.device)
    if plan.interp is not None:
        cd = _compute_dtype(x.dtype)
        y = F.interpolate(x.to(cd), **plan.interp)
        return _cast_back(y, x.dtype)
    if not plan.steps:
        return x.clone()
    y, weighted = x, False
    for a, out_w, cache in plan.steps:
        idx, w, extrap = cache.get(x.device)
        g = y.index_select(a, idx)
        if w is not None:
            if not weighted:
                g = g.to(_compute_dtype(x.dtype))
                weighted = True
            n = w.shape[1]
            g = g.reshape(g.shape[:a] + (out_w, n) + g.shape[a + 1:])
            g = (g * w.to(g.dtype).reshape((out_w, n) + (1,) * (g.dim() - a - 2))).sum(a + 1)
        if extrap is not None:
            fill = torch.tensor(extrap_value, dtype=g.dtype, device=g.device)
            g = torch.where(extrap.reshape((out_w,) + (1,) * (g.dim() - a - 1)), fill, g)
        y = g
    return _cast_back(y, x.dtype) if weighted else y.to(x.dtype)


def _cast_back(y: torch.Tensor, dtype) -> torch.Tensor:
    if y.dtype == dtype:
        return y
    if dtype.is_floating_point:
        return y.to(dtype)
    info = torch.iinfo(dtype)
    return y.round().clamp(info.min, info.max).to(dtype)


# ---------------------------------------------------------------- kernels

def _floats(t):
    return None if t is None or t.numel() == 0 else [float(v) for v in t.reshape(-1).tolist()]


def _roi_tensor(t):
    return None if t is None or t.numel() == 0 else t.detach().to("cpu", copy=True).reshape(-1)


def _make_kernel(ctx: NodeContext, o: Opts, scales_in: int | None, sizes_in: int | None, roi_in: int | None,
                 scales_attr=None):
    def const_or_missing(i, reader):
        if i is None or not ctx.has_input(i):
            return True, None
        c = ctx.const(i)
        return (c is not None), (reader(c) if c is not None else None)

    s_known, scales = (True, scales_attr) if scales_attr is not None else const_or_missing(scales_in, _floats)
    z_known, sizes = const_or_missing(sizes_in, lambda c: None if c.numel() == 0 else runtime_ints(c))
    r_known, roi = const_or_missing(roi_in, _roi_tensor)
    if s_known and z_known and scales is None and sizes is None:
        raise ctx.unsupported("neither scales nor sizes is given")
    extrap = float(o.extrap or 0.0)
    all_known = s_known and z_known and r_known
    cache: dict = {}

    def plan_for(shape, args):
        sc = scales if s_known else _floats(args[scales_in])
        sz = sizes if z_known else (None if args[sizes_in] is None or args[sizes_in].numel() == 0
                                    else runtime_ints(args[sizes_in]))
        ro = roi if r_known else _roi_tensor(args[roi_in])
        key = (tuple(shape), None if all_known else (tuple(sc or ()), tuple(sz or ()),
                                                     () if ro is None else tuple(ro.tolist())))
        plan = cache.get(key)
        if plan is None:
            if len(cache) >= _PLAN_CACHE_SIZE:
                cache.clear()
            plan = cache[key] = Plan(o, shape, sc, sz, ro)
        return plan

    def kernel(x, *args):
        args = (x,) + args + (None,) * 4
        return run_plan(plan_for(x.shape, args), x, extrap)
    return kernel, (scales if s_known else None), (sizes if z_known else None)


def _opts(ctx: NodeContext, legacy: bool = False) -> Opts:
    """Attributes; ``legacy`` (Upsample, Resize-10): asymmetric coordinates, no other attribute."""
    v = ctx.version
    mode = ctx.attr("mode", "nearest")
    legacy = legacy or v < 11
    if legacy:
        o = Opts(mode="linear" if mode in ("linear", "bilinear") else mode, coord="asymmetric",
                 nearest="simple", cubic_a=-0.75, exclude=0, extrap=0.0, antialias=0, axes=None,
                 policy="stretch")
    else:
        axes = ctx.attr("axes", None) if v >= 18 else None
        o = Opts(mode=mode, coord=ctx.attr("coordinate_transformation_mode", "half_pixel"),
                 nearest=ctx.attr("nearest_mode", "round_prefer_floor"),
                 cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)), exclude=int(ctx.attr("exclude_outside", 0)),
                 extrap=float(ctx.attr("extrapolation_value", 0.0)),
                 antialias=int(ctx.attr("antialias", 0)) if v >= 18 else 0,
                 axes=None if axes is None else [int(a) for a in axes],
                 policy=ctx.attr("keep_aspect_ratio_policy", "stretch") if v >= 18 else "stretch")
    if o.mode not in ("nearest", "linear", "cubic") or (legacy and o.mode == "cubic"):
        raise ctx.unsupported(f"mode {o.mode!r}")
    if o.coord not in _COORD_MODES or (o.coord == "half_pixel_symmetric" and v < 19):
        raise ctx.unsupported(f"coordinate_transformation_mode {o.coord!r}")
    if o.nearest not in _NEAREST_MODES:
        raise ctx.unsupported(f"nearest_mode {o.nearest!r}")
    if o.policy not in ("stretch", "not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy {o.policy!r}")
    if o.antialias and o.mode == "nearest":
        raise ctx.unsupported("antialias with mode 'nearest'")
    if ctx.dtype(0).name in ("BOOL", "STRING") or ctx.dtype(0).name.startswith("FLOAT8"):
        if o.mode != "nearest":
            raise ctx.unsupported(f"{o.mode} interpolation of {ctx.dtype(0).name} data")
    return o


def _resize_infer_from(ctx: NodeContext, o: Opts, scales, sizes):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    if s is None:
        return [(dt, None)]
    if (scales is None and sizes is None) or not all(isinstance(d, int) for d in s):
        if sizes is not None and o.policy == "stretch":
            axes = list(range(len(s))) if o.axes is None else [normalize_axis(a, len(s)) for a in o.axes]
            out = list(s)
            for a, z in zip(axes, sizes):
                out[a] = z
            return [(dt, tuple(out))]
        return [(dt, (None,) * len(s))]
    _, out, _ = output_geometry(o, s, scales, sizes)
    return [(dt, tuple(out))]


def _resize_inputs(ctx: NodeContext):
    """(scales input, sizes input, roi input) positions for this opset."""
    if ctx.version < 11:
        return 1, None, None
    return 2, 3, 1


def _resize_infer(ctx: NodeContext):
    o = _opts(ctx)
    si, zi, ri = _resize_inputs(ctx)
    _, scales, sizes = _make_kernel(ctx, o, si, zi, ri)
    return _resize_infer_from(ctx, o, scales, sizes)


@register("Resize", since=10, infer=_resize_infer, layout_sensitive=True)
def _resize(ctx: NodeContext):
    o = _opts(ctx)
    si, zi, ri = _resize_inputs(ctx)
    return _make_kernel(ctx, o, si, zi, ri)[0]


def _upsample_scales(ctx: NodeContext):
    if ctx.version < 9:
        return [float(s) for s in ctx.attr("scales")]
    return None


def _upsample_infer(ctx: NodeContext):
    o = _opts(ctx, legacy=True)
    _, scales, sizes = _make_kernel(ctx, o, 1, None, None, _upsample_scales(ctx))
    return _resize_infer_from(ctx, o, scales, sizes)


@register("Upsample", since=7, infer=_upsample_infer, layout_sensitive=True)
def _upsample(ctx: NodeContext):
    o = _opts(ctx, legacy=True)
    return _make_kernel(ctx, o, 1, None, None, _upsample_scales(ctx))[0]
