"""Tensor generators and scans: ConstantOfShape, Range, EyeLike, Trilu, CumSum, CumProd,
ReverseSequence.

Output shapes that come from constant inputs are inferred without allocating anything
(a ConstantOfShape declaring 10^15 elements only gets a shape). Random generators live in
``generators_random.py``.
"""
from __future__ import annotations

import math

import torch

from ..ir import DType
from ._tensor_util import dtype_or_none, onnx_dtype_attr, runtime_ints, unsigned_safe
from .common import const_ints, normalize_axis, same_as_input
from .precision_reasons import REDUCTION
from .registry import FusionKind, NodeContext, register
from .shape_values import shape_scalar
from .run_limits import check_tensor


# ---------------------------------------------------------------- ConstantOfShape

def _cos_value(ctx: NodeContext) -> torch.Tensor:
    v = ctx.attr("value", None)
    if v is None:
        return torch.zeros((), dtype=torch.float32)
    if not isinstance(v, torch.Tensor) or v.numel() != 1:
        raise ctx.unsupported("value must be a one-element tensor")
    return v.reshape(())


def _cos_infer(ctx: NodeContext):
    dt = DType.from_torch(_cos_value(ctx).dtype)
    shape = const_ints(ctx, 0)
    if shape is not None:
        if any(d < 0 for d in shape):
            raise ValueError(f"ConstantOfShape: negative dim in {shape}")
        return [(dt, tuple(shape))]
    s = ctx.shape(0)
    if s is not None and len(s) == 1 and isinstance(s[0], int):
        return [(dt, (None,) * s[0])]
    return [(dt, None)]


@register("ConstantOfShape", since=9, infer=_cos_infer, splat=lambda ctx, xs: _cos_value(ctx))
def _constant_of_shape(ctx: NodeContext):
    value = _cos_value(ctx)
    fill, dtype = value.item(), value.dtype
    shape = const_ints(ctx, 0)
    if shape is not None:
        shape = tuple(shape)
        return lambda s: torch.full(shape, fill, dtype=dtype, device=s.device)
    limits, node = ctx.limits, ctx.node

    def kernel(s):
        dims = tuple(runtime_ints(s))
        check_tensor(limits, node, dims, dtype)
        return torch.full(dims, fill, dtype=dtype, device=s.device)
    return kernel


# ---------------------------------------------------------------- Range

def _range_len(start, limit, delta) -> int:
    if delta == 0:
        raise ValueError("Range: delta is 0")
    return max(int(math.ceil((limit - start) / delta)), 0)


def _scalar(t: torch.Tensor):
    return t.reshape(-1)[0].item()


def _range_infer(ctx: NodeContext):
    """Its length from constants; ``Range(0, d, 1)`` of a dim ``d`` read from a shape (position
    ids: ``ops/shape_values.shape_scalar``) is ``d`` long, symbolic or not."""
    dt = dtype_or_none(ctx)
    consts = [ctx.const(i) for i in range(3)]
    if all(c is not None for c in consts):
        return [(dt, (_range_len(*[_scalar(c) for c in consts]),))]
    start, delta = consts[0], consts[2]
    if start is not None and delta is not None and start.numel() == delta.numel() == 1 and \
            _scalar(start) == 0 and _scalar(delta) == 1 and not start.is_floating_point():
        d = shape_scalar(ctx.node.inputs[1])
        if d is not None:
            return [(dt, (d,))]
    return [(dt, (None,))]


def _make_range(start, limit, delta, dtype, device):
    n = _range_len(start, limit, delta)
    if not dtype.is_floating_point:
        return torch.arange(start, start + n * delta, delta, dtype=dtype, device=device)[:n]
    steps = torch.arange(n, dtype=torch.float64, device=device)
    return (steps * delta + start).to(dtype)


@register("Range", since=11, infer=_range_infer)
def _range(ctx: NodeContext):
    consts = [ctx.const(i) for i in range(3)]
    vals = [None if c is None else _scalar(c) for c in consts]
    dtype = ctx.dtype(0).to_torch()
    limits, node = ctx.limits, ctx.node

    def kernel(s, l, d):
        st, li, de = (v if v is not None else _scalar(t) for v, t in zip(vals, (s, l, d)))
        if not all(v is not None for v in vals):
            check_tensor(limits, node, (_range_len(st, li, de),), dtype)
        return _make_range(st, li, de, dtype, s.device)
    return kernel


# ---------------------------------------------------------------- EyeLike / Trilu

def _eyelike_infer(ctx: NodeContext):
    dt = onnx_dtype_attr(ctx, "dtype", dtype_or_none(ctx))
    return [(dt, ctx.shape(0))]


@register("EyeLike", since=9, infer=_eyelike_infer)
def _eyelike(ctx: NodeContext):
    dt = onnx_dtype_attr(ctx, "dtype", ctx.dtype(0))
    if dt is None or dt == DType.UNDEFINED:
        raise ctx.unsupported("unknown output dtype")
    dtype = dt.to_torch()
    k = int(ctx.attr("k", 0))

    def kernel(x):
        if x.dim() != 2:
            raise ValueError(f"EyeLike takes a 2-D input, got rank {x.dim()}")
        n, m = x.shape
        rows = torch.arange(n, device=x.device).unsqueeze(1)
        cols = torch.arange(m, device=x.device).unsqueeze(0)
        return (cols - rows == k).to(dtype)
    return kernel


@register("Trilu", since=14, infer=same_as_input(0), layout_sensitive=True)
def _trilu(ctx: NodeContext):
    upper = bool(ctx.attr("upper", 1))
    c = ctx.const(1) if ctx.has_input(1) else torch.zeros((), dtype=torch.int64)
    k_const = None if c is None else int(c.reshape(-1)[0])
    fn = torch.triu if upper else torch.tril

    def kernel(x, k=None):
        kk = k_const if k_const is not None else int(k.reshape(-1)[0].item())
        if x.dtype == torch.bool:
            return fn(x.to(torch.uint8), kk).to(torch.bool)
        return fn(x, kk)
    return unsigned_safe(ctx, kernel)


# ---------------------------------------------------------------- CumSum / CumProd

def _scan_builder(ctx: NodeContext, fn, identity: int):
    exclusive = bool(ctx.attr("exclusive", 0))
    reverse = bool(ctx.attr("reverse", 0))
    c = ctx.const(1)
    axis_const = None if c is None else int(c.reshape(-1)[0])

    def kernel(x, ax=None):
        a = axis_const if axis_const is not None else int(ax.reshape(-1)[0].item())
        a = normalize_axis(a, x.dim())
        if reverse:
            x = x.flip(a)
        y = fn(x, a, dtype=x.dtype)
        if exclusive and x.shape[a] > 0:
            head = torch.full_like(x.narrow(a, 0, 1), identity)
            y = torch.cat([head, y.narrow(a, 0, x.shape[a] - 1)], dim=a)
        return y.flip(a) if reverse else y
    return unsigned_safe(ctx, kernel)


@register("CumSum", since=11, infer=same_as_input(0), layout_sensitive=True, precision=REDUCTION)
def _cumsum(ctx: NodeContext):
    return _scan_builder(ctx, torch.cumsum, 0)


@register("CumProd", since=26, infer=same_as_input(0), layout_sensitive=True)
def _cumprod(ctx: NodeContext):
    return _scan_builder(ctx, torch.cumprod, 1)


# ---------------------------------------------------------------- ReverseSequence

@register("ReverseSequence", since=10, fusion=FusionKind.INJECTIVE, infer=same_as_input(0),
          layout_sensitive=True)
def _reverse_sequence(ctx: NodeContext):
    batch_axis = int(ctx.attr("batch_axis", 1))
    time_axis = int(ctx.attr("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.unsupported(f"batch_axis={batch_axis}, time_axis={time_axis} (must be 0 and 1)")

    def kernel(x, lens):
        steps = x.shape[time_axis]
        t = torch.arange(steps, device=x.device).unsqueeze(0)
        n = lens.long().reshape(-1, 1)
        idx = torch.where(t < n, n - 1 - t, t)  # [batch, time]
        if time_axis < batch_axis:
            idx = idx.t()
        idx = idx.reshape(tuple(idx.shape) + (1,) * (x.dim() - 2)).expand(x.shape)
        return torch.gather(x, time_axis, idx)
    return unsigned_safe(ctx, kernel)
