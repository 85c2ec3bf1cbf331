"""Pooling: MaxPool (with ONNX indices), AveragePool, LpPool, Global*Pool, MaxUnpool (RoiAlign
and MaxRoiPool: ``roi_pool.py``).

Windows follow the ONNX geometry (auto_pad, asymmetric pads, dilations, ceil_mode with the
"last window starts inside" rule). When torch's symmetric padding expresses the node exactly,
the native ``max_pool``/``avg_pool`` call runs; otherwise the input is padded explicitly
(``-inf`` for max, zeros for sums) and windows are summed exactly (``sum_pool``), then
divided by a per-shape cached element count.
"""
from __future__ import annotations

import functools

import math

import torch
import torch.nn.functional as F

from ..ir import DType
from .conv import auto_pads, check_rank, ints_attr, torch_pad_list
from .registry import FusionKind, NodeContext, Precision, register
from .value_range import SAME_AS_INPUT

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


def native_pool2d(ctx: NodeContext, geo: PoolGeometry, kind: str):
    """(symmetric pads, ceil_mode) with which torch's 2-D ``max_pool2d`` / ``avg_pool2d`` on a
    float32 or bfloat16 input of static shape compute this node exactly, or None."""
    xs = ctx.shape(0)
    if not (len(geo.kernel) == 2 and ctx.dtype(0) in (DType.FLOAT, DType.BFLOAT16) and xs is not None
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


def pool_infer(ctx: NodeContext):
    """MaxPool / AveragePool outputs by the ONNX window geometry (``PoolGeometry``; symbolic
    spatial sizes stay unknown); MaxPool's indices are int64 of the same shape."""
    xs, dtype = ctx.shape(0), ctx.dtype(0) or None
    spatial = None
    if xs is not None:
        geo = PoolGeometry(ctx)
        if all(isinstance(d, int) for d in xs[2:]):
            out = geo.resolve(tuple(xs[2:]))[0]
            if min(out, default=1) <= 0:
                raise ValueError(f"pool output size {out} from input {tuple(xs)}")
            spatial = tuple(xs[:2]) + tuple(out)
        else:
            spatial = tuple(xs[:2]) + (None,) * (len(xs) - 2)
    outs = [(dtype, spatial)]
    if ctx.n_outputs > 1:
        outs.append((DType.INT64, spatial))
    return outs


_SMALL_INTS = (torch.uint8, torch.int8, torch.int16)


# a pooled value is one of its window's (a maximum) or within their range (a mean, padding counted as 0)
@register("MaxPool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=pool_infer,
          precision=(Precision.FOLLOW, "a window maximum: exact in any type"), value_range=SAME_AS_INPUT)
def _max_pool(ctx: NodeContext):
    geo = PoolGeometry(ctx)
    storage = int(ctx.attr("storage_order", 0))
    want_idx = ctx.n_outputs > 1
    k, s, d = geo.kernel, geo.strides, geo.dil

    def max_pool(x):
        if x.dtype in _SMALL_INTS and not want_idx:
            # torch's 8-bit channels-last max pool fails its own size check; float32 holds
            # every 8 / 16-bit integer exactly, and a maximum is one of them
            return max_pool(x.to(torch.float32)).to(x.dtype)
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
    return max_pool


# ----------------------------------------------------------------------------- AveragePool
@register("AveragePool", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=pool_infer,
          precision=(Precision.FOLLOW, "a small window mean: torch accumulates in float32 and rounds once"),
          value_range=SAME_AS_INPUT)
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
    return average_pool


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
          writes_out=True, precision=(Precision.FOLLOW, "a mean over the plane: its kernels sum in float32 and round "
                                                       "once, as AveragePool's"),
          value_range=SAME_AS_INPUT)
def _global_average_pool(ctx: NodeContext):
    def gap(x, out=None):
        return _gap(x, out)
    return gap


def _gap(x, out=None):
    if x.dim() == 4 and x.device.type == "cpu" and x.dtype == torch.float32 \
            and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return _gap_channels_last(x, out)
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
          writes_out=True, precision=(Precision.FOLLOW, "a maximum: exact in any type"), value_range=SAME_AS_INPUT)
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
