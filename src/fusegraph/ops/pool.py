"""Pooling: MaxPool (with ONNX indices), AveragePool, LpPool, Global*Pool, MaxUnpool, RoiAlign,
MaxRoiPool.

Windows follow the ONNX geometry (auto_pad, asymmetric pads, dilations, ceil_mode with the
"last window starts inside" rule). When torch's symmetric padding expresses the node exactly,
the native ``max_pool``/``avg_pool`` call runs; otherwise the input is padded explicitly
(``-inf`` for max, zeros for sums) and windows are summed exactly (``sum_pool``), then
divided by a per-shape cached element count. RoiAlign samples bilinearly with gathers;
MaxRoiPool loops over regions (their count and boxes are data).
"""
from __future__ import annotations

import functools

import math

import torch
import torch.nn.functional as F

from ..ir import DType
from . import onednn_graph
from .conv import auto_pads, check_rank, ints_attr, torch_pad_list
from .onednn_graph_cnn import pool_kernel
from .registry import Deferred, FusionKind, NodeContext, register
from .threading_policy import serial_if

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


class PoolGeometry:
    """Pool attributes read once; output size and pads resolved per input spatial shape."""

    def __init__(self, ctx: NodeContext):
        self.kernel = ints_attr(ctx, "kernel_shape")
        if not self.kernel:
            raise ctx.unsupported("kernel_shape is required")
        n = len(self.kernel)
        self.auto_pad = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
        self.ceil = bool(ctx.attr("ceil_mode", 0))
        self.dil = ints_attr(ctx, "dilations") or [1] * n
        self.strides = ints_attr(ctx, "strides") or [1] * n
        self.pads = ints_attr(ctx, "pads")
        self.eff = [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dil)]
        self._cache: dict[tuple, tuple] = {}
        check_rank(ctx, 0, (n + 2,))

    def resolve(self, in_sizes: tuple):
        """(out sizes, begin pads, end pads (explicit), end pads covering every window)."""
        got = self._cache.get(in_sizes)
        if got is not None:
            return got
        s, eff, n = self.strides, self.eff, len(self.kernel)
        begin, end = auto_pads(self.auto_pad, in_sizes, eff, s, self.pads)
        out = []
        for i in range(n):
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                o = -(-in_sizes[i] // s[i])
            else:
                num = in_sizes[i] + begin[i] + end[i] - eff[i]
                if self.ceil and self.auto_pad == "NOTSET":
                    o = -(-num // s[i]) + 1
                    if (o - 1) * s[i] >= in_sizes[i] + begin[i]:
                        o -= 1
                else:
                    o = num // s[i] + 1
            out.append(max(o, 0))
        cover = [(out[i] - 1) * s[i] + eff[i] - in_sizes[i] - begin[i] for i in range(n)]
        got = (out, begin, end, cover)
        self._cache[in_sizes] = got
        return got

    def native_pad(self, in_sizes, out, begin, end, limit) -> int | list | None:
        """The symmetric torch padding reproducing this geometry, or None."""
        ceil = self.ceil and self.auto_pad == "NOTSET"
        for i in range(len(out)):
            b = begin[i]
            if b != end[i] or b < 0 or b > limit[i] // 2:
                return None
            num = in_sizes[i] + 2 * b - self.eff[i]
            o = (-(-num // self.strides[i]) if ceil else num // self.strides[i]) + 1
            if ceil and (o - 1) * self.strides[i] >= in_sizes[i] + b:
                o -= 1
            if o != out[i]:
                return None
        return list(begin)


def _low(dtype: torch.dtype):
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def sum_pool(xp, kernel, strides, dilations):
    """Exact window sums over a (pre-padded) N-d tensor.

    ``avg_pool`` with a divisor of 1 when undilated, else a sum over strided ``unfold`` views
    (no convolution, so no TF32 rounding on CUDA)."""
    nd = xp.dim() - 2
    if all(d == 1 for d in dilations):
        if nd == 1:
            y = F.avg_pool2d(xp.unsqueeze(-1), (kernel[0], 1), (strides[0], 1), 0, False, True, 1)
            return y.squeeze(-1)
        return _AVG[nd](xp, kernel, strides, 0, False, True, 1)
    v = xp
    for i in range(nd):
        v = v.unfold(2 + i, (kernel[i] - 1) * dilations[i] + 1, strides[i])
    v = v[(slice(None),) * (2 + nd) + tuple(slice(None, None, d) for d in dilations)]
    return v.sum(dim=tuple(range(-nd, 0)))


def _pad_to_cover(x, begin, cover, value):
    return F.pad(x, torch_pad_list(begin, cover), value=value)


def _graph_pool(ctx: NodeContext, geo: PoolGeometry, kind: str, plain, include: bool = False):
    """``plain``, or for a 2-D pool of a channels-last float32 CPU input of static shape whose
    geometry torch's symmetric padding expresses (or, for max, end-only padding that ceil mode
    reproduces) a ``Deferred`` kernel that resolves to its oneDNN Graph partition."""
    x, y = ctx.node.inputs[0], ctx.node.outputs[0]
    if not (onednn_graph.AVAILABLE and ctx.device == "cpu" and x.layout == "nhwc"):
        return plain
    native = native_pool2d(ctx, geo, kind)
    if native is None:
        return plain
    pad, ceil = native

    def build():
        got = pool_kernel(ctx.name, kind, x.shape, y.shape, geo.kernel, geo.strides, pad, geo.dil, ceil, include)
        return plain if isinstance(got, str) else got
    return Deferred(plain, build)


def native_pool2d(ctx: NodeContext, geo: PoolGeometry, kind: str):
    """(symmetric pads, ceil_mode) with which torch's 2-D ``max_pool2d`` / ``avg_pool2d`` on a
    float32 input of static shape compute this node exactly, or None."""
    xs = ctx.shape(0)
    if not (len(geo.kernel) == 2 and ctx.dtype(0) == DType.FLOAT and xs is not None
            and all(isinstance(v, int) for v in xs)):
        return None
    in_sizes = tuple(xs[2:])
    out, begin, end, _ = geo.resolve(in_sizes)
    pad = geo.native_pad(in_sizes, out, begin, end, geo.eff if kind == "max" else geo.kernel)
    ceil = geo.ceil and geo.auto_pad == "NOTSET"
    if pad is None and kind == "max" and not any(begin) and _ceil_covers(in_sizes, out, geo.eff, geo.strides):
        pad, ceil = [0, 0], True     # end-only padding: ceil mode reads the same windows
    if pad is None or (kind == "avg" and any(v != 1 for v in geo.dil)):
        return None
    return pad, ceil


# ----------------------------------------------------------------------------- MaxPool
def _onnx_indices(idx, in_sizes, padded_sizes, begin, storage_order: int):
    """torch per-plane indices (in a padded plane when ``padded_sizes``) -> ONNX flat indices."""
    n = len(in_sizes)
    plane = math.prod(in_sizes)
    if padded_sizes is None and storage_order == 0:
        flat = idx
    else:
        sizes = padded_sizes or in_sizes
        coords, rem = [], idx
        for i in reversed(range(n)):
            coords.append(rem % sizes[i])
            rem = rem // sizes[i]
        coords.reverse()
        if padded_sizes is not None:
            coords = [c - b for c, b in zip(coords, begin)]
        order = range(n) if storage_order == 0 else reversed(range(n))
        flat = None
        for i in order:
            flat = coords[i] if flat is None else flat * in_sizes[i] + coords[i]
    nc = idx.shape[0] * idx.shape[1]
    base = torch.arange(nc, device=idx.device, dtype=idx.dtype).reshape(idx.shape[:2] + (1,) * n)
    return flat + base * plane


def _ceil_covers(in_sizes, out, eff, strides) -> bool:
    """torch's unpadded ceil-mode output size equals ``out`` on every axis (its partial last
    windows then are the ONNX windows that ran past the end, where -inf padding never wins)."""
    for size, o, e, st in zip(in_sizes, out, eff, strides):
        if size < e:
            return False
        n = -(-(size - e) // st) + 1
        if (n - 1) * st >= size:
            n -= 1
        if n != o:
            return False
    return True


@register("MaxPool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True)
def _max_pool(ctx: NodeContext):
    geo = PoolGeometry(ctx)
    storage = int(ctx.attr("storage_order", 0))
    want_idx = ctx.n_outputs > 1
    k, s, d = geo.kernel, geo.strides, geo.dil

    def max_pool(x):
        if not want_idx and x.dim() == 4 and x.device.type == "cpu" and x.is_contiguous() \
                and x.shape[1] > 1 and x.shape[2] * x.shape[3] > 1:
            # torch's NCHW CPU kernel is 5-25x slower than pooling channels-last data; the
            # result goes back to the input's layout (max is exact, so the values are equal)
            return pool(x.contiguous(memory_format=torch.channels_last)).contiguous()
        return pool(x)

    def pool(x):
        in_sizes = tuple(x.shape[2:])
        out, begin, end, cover = geo.resolve(in_sizes)
        fn = _MAX[x.dim() - 2]
        pad = geo.native_pad(in_sizes, out, begin, end, geo.eff)
        if pad is not None:
            ceil = geo.ceil and geo.auto_pad == "NOTSET"
            if not want_idx:
                return fn(x, k, s, pad, d, ceil)
            y, idx = fn(x, k, s, pad, d, ceil, return_indices=True)
            return y, _onnx_indices(idx, in_sizes, None, begin, storage)
        if not want_idx and not any(begin) and _ceil_covers(in_sizes, out, geo.eff, s):
            return fn(x, k, s, 0, d, True)  # end-only padding: ceil mode reads the same windows
        xp = _pad_to_cover(x, begin, cover, _low(x.dtype))
        if not want_idx:
            return fn(xp, k, s, 0, d)
        y, idx = fn(xp, k, s, 0, d, return_indices=True)
        return y, _onnx_indices(idx, in_sizes, tuple(xp.shape[2:]), begin, storage)
    return max_pool if want_idx else _graph_pool(ctx, geo, "max", max_pool)


# ----------------------------------------------------------------------------- AveragePool
@register("AveragePool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True)
def _average_pool(ctx: NodeContext):
    geo = PoolGeometry(ctx)
    include = bool(ctx.attr("count_include_pad", 0))
    k, s, d = geo.kernel, geo.strides, geo.dil
    counts: dict[tuple, torch.Tensor] = {}

    def count(in_sizes, begin, end, cover, like):
        key = (in_sizes, like.dtype, like.device)
        c = counts.get(key)
        if c is None:
            ones = torch.ones((1, 1) + in_sizes, dtype=like.dtype, device=like.device)
            m = F.pad(ones, torch_pad_list(begin, end), value=1.0 if include else 0.0)
            m = F.pad(m, torch_pad_list([0] * len(end), [c - e for c, e in zip(cover, end)]))
            c = counts[key] = sum_pool(m, k, s, d)
        return c

    def average_pool(x):
        in_sizes = tuple(x.shape[2:])
        out, begin, end, cover = geo.resolve(in_sizes)
        if all(v == 1 for v in d):
            pad = geo.native_pad(in_sizes, out, begin, end, k)
            if pad is not None:
                return _AVG[x.dim() - 2](x, k, s, pad, geo.ceil and geo.auto_pad == "NOTSET", include)
        sums = sum_pool(_pad_to_cover(x, begin, cover, 0.0), k, s, d)
        return sums / count(in_sizes, begin, end, cover, x)
    return _graph_pool(ctx, geo, "avg", average_pool, include)


# ----------------------------------------------------------------------------- LpPool
def _p_attr(ctx: NodeContext):
    p = ctx.attr("p", 2)
    return int(p) if float(p).is_integer() else float(p)


@register("LpPool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True)
def _lp_pool(ctx: NodeContext):
    geo = PoolGeometry(ctx)
    p = _p_attr(ctx)
    k, s, d = geo.kernel, geo.strides, geo.dil

    def lp_pool(x):
        _, begin, _, cover = geo.resolve(tuple(x.shape[2:]))
        xp = x * x if p == 2 else x.abs() ** p
        y = sum_pool(_pad_to_cover(xp, begin, cover, 0.0), k, s, d)
        return y.sqrt() if p == 2 else y ** (1.0 / p)
    return lp_pool


# ----------------------------------------------------------------------------- Global pools
def _spatial(x):
    return tuple(range(2, x.dim()))


def _global_infer(ctx: NodeContext):
    shape = ctx.shape(0)
    return [(ctx.dtype(0) or None, None if shape is None else tuple(shape[:2]) + (1,) * (len(shape) - 2))]


@register("GlobalAveragePool", since=1, fusion=FusionKind.REDUCE, layout_sensitive=True, infer=_global_infer,
          writes_out=True)
def _global_average_pool(ctx: NodeContext):
    return _gap


def _gap(x, out=None):
    if x.dim() == 4 and x.device.type == "cpu" and x.dtype == torch.float32 \
            and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return serial_if(True, _gap_channels_last, x, out)   # tens of us: no fork/join
    return torch.mean(x, dim=_spatial(x), keepdim=True, out=out)


@functools.lru_cache(maxsize=64)
def _mean_row(hw: int, dtype: torch.dtype) -> torch.Tensor:
    """The read-only ``[1, hw]`` row of ``1/hw`` (made once per size, not on every run)."""
    return torch.full((1, hw), 1.0 / hw, dtype=dtype)


def _gap_channels_last(x, out):
    """Mean of channels-last data as one product ``(1/HW) [1 x HW] @ x [HW x C]`` per image.

    Every channel is a dot product with the same summation order, so channels holding equal
    data stay equal (torch's channels-last reduction treats the channel tail of a SIMD block
    differently), and the layout conversion that an NCHW ``mean`` would need (most of its time)
    is avoided."""
    n, c, h, w = x.shape
    hw = h * w
    ones = _mean_row(hw, x.dtype)
    y = out if out is not None and out.is_contiguous() else torch.empty((n, c, 1, 1), dtype=x.dtype)
    xs = x.permute(0, 2, 3, 1).reshape(n, hw, c)
    for i in range(n):
        torch.mm(ones, xs[i], out=y[i].view(1, c))
    if out is not None and y is not out:
        out.copy_(y)
        return out
    return y


@register("GlobalMaxPool", since=1, fusion=FusionKind.REDUCE, layout_sensitive=True, infer=_global_infer,
          writes_out=True)
def _global_max_pool(ctx: NodeContext):
    return lambda x, out=None: torch.amax(x, dim=_spatial(x), keepdim=True, out=out)


@register("GlobalLpPool", since=1, fusion=FusionKind.REDUCE, layout_sensitive=True, infer=_global_infer)
def _global_lp_pool(ctx: NodeContext):
    p = _p_attr(ctx)
    return lambda x: torch.linalg.vector_norm(x, ord=p, dim=_spatial(x), keepdim=True)


# ----------------------------------------------------------------------------- MaxUnpool
@register("MaxUnpool", since=9, fusion=FusionKind.OPAQUE, layout_sensitive=True)
def _max_unpool(ctx: NodeContext):
    kernel = ints_attr(ctx, "kernel_shape")
    if not kernel:
        raise ctx.unsupported("kernel_shape is required")
    n = len(kernel)
    strides = ints_attr(ctx, "strides") or [1] * n
    pads = ints_attr(ctx, "pads") or [0] * (2 * n)
    const_shape = ctx.const(2) if ctx.has_input(2) else None
    const_shape = None if const_shape is None else [int(v) for v in const_shape.tolist()]

    def max_unpool(x, idx, output_shape=None):
        sizes = [(x.shape[2 + i] - 1) * strides[i] - (pads[i] + pads[n + i]) + kernel[i] for i in range(n)]
        lead = tuple(x.shape[:2])
        y = torch.zeros(math.prod(lead) * math.prod(sizes), dtype=x.dtype, device=x.device)
        y = y.scatter(0, idx.reshape(-1), x.reshape(-1)).reshape(lead + tuple(sizes))
        target = const_shape
        if target is None and output_shape is not None:
            target = [int(v) for v in output_shape.tolist()]
        if target is not None and list(target[2:]) != sizes:
            y = F.pad(y, torch_pad_list([0] * n, [t - s for t, s in zip(target[2:], sizes)]))
        return y
    return max_unpool


# ----------------------------------------------------------------------------- RoiAlign
def _roi_infer(ph_attr: str, pw_attr: str | None = None):
    def infer(ctx: NodeContext):
        xs, rs = ctx.shape(0), ctx.shape(1)
        if pw_attr is None:
            ph, pw = ints_attr(ctx, ph_attr)
        else:
            ph, pw = int(ctx.attr(ph_attr, 1)), int(ctx.attr(pw_attr, 1))
        r = None if rs is None else rs[0]
        c = None if xs is None else xs[1]
        return [(ctx.dtype(0) or None, (r, c, ph, pw))]
    return infer


def _axis_samples(start, bin_size, grid, pooled: int, gmax: int, size: int):
    """Per-axis sample positions -> (low index, high index, low weight, high weight, valid)."""
    dev, ft = start.device, start.dtype
    p = torch.arange(pooled, device=dev, dtype=ft).reshape(1, -1, 1)
    i = torch.arange(gmax, device=dev, dtype=ft).reshape(1, 1, -1)
    g = grid.to(ft).reshape(-1, 1, 1)
    b = bin_size.reshape(-1, 1, 1)
    pos = start.reshape(-1, 1, 1) + p * b + (i + 0.5) * b / g        # (R, pooled, gmax)
    inside = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp_min(0)
    low = pos.floor()
    top = low >= size - 1
    low = torch.where(top, torch.full_like(low, size - 1), low)
    pos = torch.where(top, low, pos)
    high = torch.where(top, low, low + 1)
    frac = pos - low
    ok = inside.to(ft)
    valid = (i < g).expand_as(pos)
    return low.long(), high.long(), (1 - frac) * ok, frac * ok, valid


@register("RoiAlign", since=10, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=_roi_infer("output_height", "output_width"))
def _roi_align(ctx: NodeContext):
    mode = (ctx.attr("mode", "avg") or "avg").lower()
    if mode not in ("avg", "max"):
        raise ctx.unsupported(f"mode {mode!r}")
    default_ct = "half_pixel" if ctx.version >= 16 else "output_half_pixel"
    half = (ctx.attr("coordinate_transformation_mode", default_ct) or default_ct).lower() == "half_pixel"
    ph, pw = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    check_rank(ctx, 0, (4,))

    def roi_align(x, rois, batch_indices):
        n, c, h, w = x.shape
        r = rois.shape[0]
        ft = torch.float32 if rois.dtype in (torch.float16, torch.bfloat16) else rois.dtype
        box = rois.to(ft) * scale - (0.5 if half else 0.0)
        rw, rh = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
        if not half:
            rw, rh = rw.clamp_min(1.0), rh.clamp_min(1.0)
        bh, bw = rh / ph, rw / pw
        if ratio > 0:
            gh = gw = torch.full((r,), ratio, device=x.device, dtype=torch.int64)
            gmax_h = gmax_w = ratio
        else:
            gh, gw = torch.ceil(rh / ph).long(), torch.ceil(rw / pw).long()
            gmax_h = max(int(gh.max()) if r else 1, 1)
            gmax_w = max(int(gw.max()) if r else 1, 1)
        ylo, yhi, wyl, wyh, vy = _axis_samples(box[:, 1], bh, gh, ph, gmax_h, h)
        xlo, xhi, wxl, wxh, vx = _axis_samples(box[:, 0], bw, gw, pw, gmax_w, w)
        table = x.permute(0, 2, 3, 1).reshape(n * h * w, c)
        base = (batch_indices.long() * (h * w)).reshape(r, 1, 1)
        acc = None
        for iy in range(gmax_h):
            ya, yb = ylo[:, :, iy:iy + 1], yhi[:, :, iy:iy + 1]
            wa, wb = wyl[:, :, iy:iy + 1], wyh[:, :, iy:iy + 1]
            for ix in range(gmax_w):
                xa, xb = xlo[:, None, :, ix], xhi[:, None, :, ix]
                va, vb = wxl[:, None, :, ix], wxh[:, None, :, ix]
                idx = torch.stack([ya * w + xa, ya * w + xb, yb * w + xa, yb * w + xb]) + base
                wts = torch.stack([wa * va, wa * vb, wb * va, wb * vb]).to(x.dtype)
                vals = table[idx.reshape(-1)].reshape(4, r, ph, pw, c) * wts.unsqueeze(-1)
                ok = (vy[:, :, iy:iy + 1] & vx[:, None, :, ix]).unsqueeze(-1)
                if mode == "avg":
                    val = torch.where(ok, vals.sum(0), 0.0)
                    acc = val if acc is None else acc + val
                else:
                    val = torch.where(ok, vals.amax(0), -math.inf)
                    acc = val if acc is None else torch.maximum(acc, val)
        if mode == "avg":
            acc = acc / (gh * gw).clamp_min(1).to(x.dtype).reshape(r, 1, 1, 1)
        else:
            acc = torch.where(torch.isneginf(acc), 0.0, acc)
        return acc.permute(0, 3, 1, 2).contiguous()
    return roi_align


# ----------------------------------------------------------------------------- MaxRoiPool
def _round_away(v: float) -> int:
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


@register("MaxRoiPool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=_roi_infer("pooled_shape"))
def _max_roi_pool(ctx: NodeContext):
    shape = ints_attr(ctx, "pooled_shape")
    if not shape or len(shape) != 2:
        raise ctx.unsupported("pooled_shape must hold 2 values")
    ph, pw = shape
    scale = float(ctx.attr("spatial_scale", 1.0))

    def max_roi_pool(x, rois):
        n, c, h, w = x.shape
        outs = []
        for b, x1, y1, x2, y2 in rois.tolist():
            xs, ys = _round_away(x1 * scale), _round_away(y1 * scale)
            xe, ye = _round_away(x2 * scale), _round_away(y2 * scale)
            rw, rh = max(xe - xs + 1, 1), max(ye - ys + 1, 1)
            crop = x[int(b):int(b) + 1, :, max(ys, 0):max(min(ys + rh, h), 0), max(xs, 0):max(min(xs + rw, w), 0)]
            pads = [max(-xs, 0), rw - crop.shape[3] - max(-xs, 0), max(-ys, 0), rh - crop.shape[2] - max(-ys, 0)]
            crop = F.pad(crop, pads, value=-math.inf)
            y = F.adaptive_max_pool2d(crop, (ph, pw))
            outs.append(torch.where(torch.isneginf(y), 0.0, y))
        if not outs:
            return x.new_zeros((0, c, ph, pw))
        return torch.cat(outs, 0)
    return max_roi_pool
