"""Resize (opsets 10-19+) and the deprecated Upsample, after the ONNX spec.

Interpolation is separable: each resized axis gets, once per input shape, a table of source
indices ``[taps, out]`` and weights (nearest: one tap, no weight), computed on the CPU in
float64 in the spec's operation order (coordinate_transformation_mode, nearest_mode,
cubic_coeff_a, exclude_outside, antialias, tf_crop_and_resize extrapolation,
keep_aspect_ratio_policy, axes) and copied once to each device; the kernel gathers each tap
with advanced indexing and sums the weighted taps. A sample's taps always sit around
floor(x), consistent with its weights (the onnx reference picks them from x + pad, which
rounding can shift by one at coordinates within 1e-16 of an integer).

Where torch's ``interpolate`` computes the same thing the kernel calls it instead: linear /
cubic without antialias in half-pixel or align-corners mode on trailing spatial axes, and
nearest whenever a probe run at build time shows torch picks exactly the spec's pixels.
Given ``out=`` (a planned buffer), that path writes into it through ATen's ``out`` form of the
same upsampling kernel (``interpolate`` has none), so a run allocates nothing there: a fresh
multi-megabyte result per run is a fresh ``mmap`` whose pages fault in again on every run.
Other paths compute the result and copy it into ``out``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._resize_tables import Opts, axis_table, full_roi, output_geometry
from ._tensor_util import DeviceCache, dtype_or_none, runtime_ints, settled_strides, unsigned_safe
from .common import normalize_axis
from .registry import NodeContext, Precision, no_out, register
from .run_limits import check_tensor

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_PLAN_CACHE_SIZE = 8


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
        return dict(scale_factor=tuple(scale[2:]), mode=tmode, align_corners=align,
                    recompute_scale_factor=False)
    return dict(size=tuple(out[2:]), mode=tmode, align_corners=align)


class Plan:
    __slots__ = ("out", "steps", "interp", "empty")

    def __init__(self, o: Opts, in_shape, scales, sizes, roi):
        scale, out, axes = output_geometry(o, tuple(in_shape), scales, sizes)
        self.out = out
        self.empty = any(d == 0 for d in out)
        roi_full = full_roi(roi, axes, len(in_shape)) if o.coord == "tf_crop_and_resize" else None
        if o.coord == "tf_crop_and_resize" and roi_full is None:
            raise ValueError("Resize: tf_crop_and_resize needs roi")
        self.interp = None if roi_full is not None else _torch_path(o, in_shape, scale, out, axes,
                                                                    sizes is None)
        self.steps = []
        if self.interp is not None:
            return
        r = len(in_shape)
        for a in axes:
            pair = None if roi_full is None else (roi_full[a], roi_full[a + r])
            whole = pair is None or (math.isclose(float(pair[0]), 0.0) and math.isclose(float(pair[1]), 1.0))
            if math.isclose(scale[a], 1.0) and out[a] == in_shape[a] and whole:
                continue
            idx, w, extrap = axis_table(o, in_shape[a], out[a], scale[a], pair)
            # tap-major tables: one contiguous index / weight row per tap
            self.steps.append((a, out[a], DeviceCache(idx.t().contiguous(),
                                                      None if w is None else w.t().contiguous(), extrap)))
        if o.mode == "nearest" and roi_full is None and not self.empty:
            self.interp = self._nearest_interp(in_shape, scale, sizes is None)

    def _nearest_interp(self, in_shape, scale, from_scales):
        """torch's nearest / nearest-exact arguments when they pick exactly the spec's pixels.

        Checked, not assumed: both are run at build time on a probe holding each pixel's
        own index, and compared with the spec's tables.
        """
        r = len(in_shape)
        if not 3 <= r <= 5 or self.out[:2] != list(in_shape[:2]) or any(s != 1 for s in scale[:2]):
            return None
        if any(a < 2 for a, _, _ in self.steps) or not self.steps:
            return None
        spatial = tuple(in_shape[2:])
        total = 1
        for d in spatial:
            total *= d
        if total > 1 << 22:
            return None
        probe = torch.arange(total, dtype=torch.float64, device="cpu").reshape((1, 1) + spatial)
        want = run_plan(self, probe, 0.0)
        geometry = (dict(scale_factor=tuple(scale[2:]), recompute_scale_factor=False) if from_scales
                    else dict(size=tuple(self.out[2:])))
        for tmode in ("nearest", "nearest-exact"):
            args = dict(geometry, mode=tmode)
            try:
                got = F.interpolate(probe, **args)
            except (RuntimeError, ValueError):
                continue
            if got.shape == want.shape and torch.equal(got, want):
                return args
        return None


def _compute_dtype(dtype):
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


_ATEN_OUT = {   # interpolate's mode -> ATen's out form, by spatial rank
    "linear": {1: "upsample_linear1d"}, "bilinear": {2: "upsample_bilinear2d"},
    "trilinear": {3: "upsample_trilinear3d"}, "bicubic": {2: "upsample_bicubic2d"},
    "nearest": {1: "upsample_nearest1d", 2: "upsample_nearest2d", 3: "upsample_nearest3d"},
    "nearest-exact": {1: "_upsample_nearest_exact1d", 2: "_upsample_nearest_exact2d", 3: "_upsample_nearest_exact3d"},
}


def interpolate_into(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> bool:
    """``F.interpolate(x, **plan.interp)`` written into ``out`` by the ATen kernel it calls, with
    the arguments it passes (the output size, and the scales when given as factors); False
    where that form does not apply (another dtype, an ``out`` of another type or shape)."""
    interp = plan.interp
    if interp is None or x.dtype not in (torch.float32, torch.float64) or out.dtype != x.dtype \
            or tuple(out.shape) != tuple(plan.out) or x.device != out.device:
        return False
    name = _ATEN_OUT.get(interp["mode"], {}).get(x.dim() - 2)
    if name is None:
        return False
    size = list(plan.out[2:])
    factors = interp.get("scale_factor")
    scales = list(factors) if factors is not None else [None] * len(size)
    args = (size,) + ((bool(interp["align_corners"]),) if "align_corners" in interp else ()) + tuple(scales)
    getattr(torch.ops.aten, name).out(settled_strides(x), *args, out=settled_strides(out))
    return True


def run_plan(plan: Plan, x: torch.Tensor, extrap_value: float) -> torch.Tensor:
    if plan.empty or x.numel() == 0:
        return torch.empty(plan.out, dtype=x.dtype, device=x.device)
    if plan.interp is not None and (x.is_floating_point() or not plan.steps):
        cd = _compute_dtype(x.dtype)
        y = F.interpolate(settled_strides(x).to(cd), **plan.interp)   # channels-last data stays so
        return _cast_back(y, x.dtype)
    if not plan.steps:
        return x.clone()
    weighted = plan.steps[0][2].get(x.device)[1] is not None
    y = x.to(_compute_dtype(x.dtype)) if weighted else x
    for a, out_w, cache in plan.steps:
        idx, w, extrap = cache.get(x.device)
        lead = (slice(None),) * a  # advanced indexing: far faster than index_select on CPU
        if w is None:
            g = y[lead + (idx[0],)]
        else:
            shape = (out_w,) + (1,) * (y.dim() - a - 1)
            w = w.to(y.dtype)
            g = y[lead + (idx[0],)] * w[0].reshape(shape)
            for k in range(1, idx.shape[0]):
                g += y[lead + (idx[k],)] * w[k].reshape(shape)
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
    limits, node = ctx.limits, ctx.node

    def plan_for(shape, args):
        sc = scales if s_known else _floats(args[scales_in])
        sz = sizes if z_known else (None if args[sizes_in] is None or args[sizes_in].numel() == 0
                                    else runtime_ints(args[sizes_in]))
        ro = roi if r_known else _roi_tensor(args[roi_in])
        key = (tuple(shape), None if all_known else (tuple(sc or ()), tuple(sz or ()),
                                                     () if ro is None else tuple(ro.tolist())))
        plan = cache.get(key)
        if plan is None:
            if not all_known:          # sizes from run-time data: checked before any table is made
                check_tensor(limits, node, output_geometry(o, tuple(shape), sc, sz)[1], args[0].dtype)
            if len(cache) >= _PLAN_CACHE_SIZE:
                cache.clear()
            plan = cache[key] = Plan(o, shape, sc, sz, ro)
        return plan

    def kernel(x, *args, out=None):
        args = (x,) + args + (None,) * 4
        plan = plan_for(x.shape, args)
        if out is None:
            return run_plan(plan, x, extrap)
        if not (x.numel() and interpolate_into(plan, x, out)):
            out.copy_(run_plan(plan, x, extrap))
        return out
    if o.mode == "nearest":
        safe = unsigned_safe(ctx, kernel)       # wide unsigned data as signed views: no out form there
        kernel = kernel if safe is kernel else no_out(safe)
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


INTERPOLATION = (Precision.FOLLOW, "an interpolation of a few pixels: computed in float32, rounded once")


@register("Resize", since=10, infer=_resize_infer, layout_sensitive=True, writes_out=True, precision=INTERPOLATION)
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


@register("Upsample", since=7, infer=_upsample_infer, layout_sensitive=True, precision=INTERPOLATION)
def _upsample(ctx: NodeContext):
    o = _opts(ctx, legacy=True)
    return _make_kernel(ctx, o, 1, None, None, _upsample_scales(ctx))[0]
