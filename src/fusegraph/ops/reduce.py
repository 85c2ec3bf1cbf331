"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax, ArgMin.

``axes`` is an attribute before opset 18 (ReduceSum: before 13) and an optional input from
then on, with ``noop_with_empty_axes``. Reductions over an empty set give the ONNX identity
(sum 0, prod 1, max the lowest value, min the highest, log-sum -inf). Unsigned types torch
cannot reduce (uint16/32/64) are computed in int64 with an order-preserving map where needed.
Softmax-like ops live in ``softmax.py``.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .common import const_ints, normalize_axis
from .precision_reasons import REDUCTION
from .registry import FusionKind, NodeContext, register

_INT64_MIN = -(1 << 63)
_WIDEN = (DType.UINT16, DType.UINT32)
_NUMERIC = {DType.UNDEFINED, DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16, DType.INT8,
            DType.INT16, DType.INT32, DType.INT64, DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64}


def _full_dims(dims: tuple, rank: int) -> list[int]:
    return list(dims) if dims else list(range(rank))


def _lowest(dtype: torch.dtype):
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min if not dtype.is_floating_point else float("-inf")


def _highest(dtype: torch.dtype):
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max if not dtype.is_floating_point else float("inf")


def _out_shape(shape, dims, keepdim: bool) -> list[int]:
    return [1 if i in dims else d for i, d in enumerate(shape) if keepdim or i not in dims]


def _sum(x, dims, keep):
    return torch.sum(x, dims, keepdim=keep, dtype=x.dtype) if dims else x.clone()


def _mean(x, dims, keep):
    if x.dtype.is_floating_point:
        return torch.mean(x, dims, keepdim=keep) if dims else x.clone()
    count = 1
    for d in dims:
        count *= x.shape[d]
    return torch.div(_sum(x, dims, keep), max(count, 1), rounding_mode="trunc")


def _extreme(fn, fill):
    def reduce(x, dims, keep):
        if not dims:
            return x.clone()
        if x.numel() == 0:
            return torch.full(_out_shape(x.shape, dims, keep), fill(x.dtype), dtype=x.dtype,
                              device=x.device)
        return fn(x, dims, keepdim=keep)
    return reduce


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=True, dtype=x.dtype)
    if not keep and dims:
        x = x.reshape(_out_shape(x.shape, dims, False))
    return x if dims else x.clone()


def _l1(x, dims, keep):
    return _sum(x.abs() if x.dtype.is_signed else x, dims, keep)


def _float_then_back(fn):
    """Compute in floating point; integer inputs go through float64 and truncate back."""
    def reduce(x, dims, keep):
        if x.dtype.is_floating_point:
            return fn(x, dims, keep)
        return torch.trunc(fn(x.to(torch.float64), dims, keep)).to(x.dtype)
    return reduce


def _l2(x, dims, keep):
    return torch.sqrt(_sum(x * x, dims, keep))


def _log_sum(x, dims, keep):
    return torch.log(_sum(x, dims, keep))


def _log_sum_exp(x, dims, keep):
    if not dims:
        return x.clone()
    return torch.logsumexp(x, dims, keepdim=keep)


def _sum_square(x, dims, keep):
    return _sum(x * x, dims, keep)


# op -> (reduce function, how unsigned types torch lacks are mapped: True order-preserving
# int64 map, False plain int64, None through float64)
_REDUCERS = {
    "ReduceSum": (_sum, False),
    "ReduceMean": (_mean, False),
    "ReduceMax": (_extreme(torch.amax, _lowest), True),
    "ReduceMin": (_extreme(torch.amin, _highest), True),
    "ReduceProd": (_prod, False),
    "ReduceL1": (_l1, False),
    "ReduceL2": (_float_then_back(_l2), None),
    "ReduceLogSum": (_float_then_back(_log_sum), None),
    "ReduceLogSumExp": (_float_then_back(_log_sum_exp), None),
    "ReduceSumSquare": (_sum_square, False),
}


def _for_dtype(fn, dtype: DType, order_sensitive):
    """Adapt ``fn`` to unsigned types torch cannot reduce directly."""
    if dtype in _WIDEN + (DType.UINT64,) and order_sensitive is None:
        tdt = dtype.to_torch()
        return lambda x, d, k: fn(x.to(torch.float64), d, k).trunc().to(tdt)
    if dtype in _WIDEN:
        tdt = dtype.to_torch()
        return lambda x, d, k: fn(x.to(torch.int64), d, k).to(tdt)
    if dtype == DType.UINT64:
        if order_sensitive:
            return lambda x, d, k: (fn(x.view(torch.int64) ^ _INT64_MIN, d, k) ^ _INT64_MIN).view(torch.uint64)
        return lambda x, d, k: fn(x.view(torch.int64), d, k).view(torch.uint64)
    return fn


def _axes_source(ctx: NodeContext, input_since: int):
    """(static axes list or None when dynamic, noop_with_empty_axes)."""
    if ctx.version < input_since:
        return list(ctx.attr("axes", None) or []), False
    noop = bool(ctx.attr("noop_with_empty_axes", 0))
    if not ctx.has_input(1):
        return [], noop
    return const_ints(ctx, 1), noop


def _resolve(axes: list[int], rank: int, noop: bool) -> tuple:
    """Sorted reduced dims; () with noop_with_empty_axes reduces over the empty set, so the
    reduction is the identity but composite steps still apply (ReduceSumSquare squares)."""
    if not axes:
        return () if noop else tuple(range(rank))
    return tuple(sorted({normalize_axis(int(a), rank) for a in axes}))


def _make_infer(input_since: int):
    def infer(ctx: NodeContext):
        axes, noop = _axes_source(ctx, input_since)
        shape = ctx.shape(0)
        dtype = ctx.dtype(0) or None
        if axes is None or shape is None:
            return [(dtype, None)]
        dims = _resolve(axes, len(shape), noop)
        keep = bool(ctx.attr("keepdims", 1))
        return [(dtype, tuple(_out_shape(shape, dims, keep)))]
    return infer


def _make_reduce(op_type: str, input_since: int):
    fn, order_sensitive = _REDUCERS[op_type]

    def build(ctx: NodeContext):
        dtype = ctx.dtype(0)
        allowed = _NUMERIC | ({DType.BOOL} if op_type in ("ReduceMax", "ReduceMin") else set())
        if dtype not in allowed:
            raise ctx.unsupported(f"input dtype {dtype.name}")
        red = _for_dtype(fn, dtype, order_sensitive)
        keep = bool(ctx.attr("keepdims", 1))
        axes, noop = _axes_source(ctx, input_since)

        if axes is not None:
            def kernel(x, *_):
                return red(x, _resolve(axes, x.dim(), noop), keep)
        else:
            def kernel(x, axes_t=None, *_):
                given = [] if axes_t is None else [int(a) for a in axes_t.reshape(-1).tolist()]
                return red(x, _resolve(given, x.dim(), noop), keep)
        return kernel

    register(op_type, since=1, fusion=FusionKind.REDUCE, infer=_make_infer(input_since), precision=REDUCTION)(build)


for _op in _REDUCERS:
    _make_reduce(_op, 13 if _op == "ReduceSum" else 18)


# ---------------------------------------------------------------- ArgMax / ArgMin

def _arg_infer(ctx: NodeContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(DType.INT64, None)]
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(shape))
    return [(DType.INT64, tuple(_out_shape(shape, (axis,), bool(ctx.attr("keepdims", 1)))))]


def _make_arg(op_type: str, fn):
    @register(op_type, since=1, fusion=FusionKind.REDUCE, infer=_arg_infer)
    def build(ctx: NodeContext):
        dtype = ctx.dtype(0)
        if dtype not in _NUMERIC | {DType.BOOL}:
            raise ctx.unsupported(f"input dtype {dtype.name}")
        axis = int(ctx.attr("axis", 0))
        keep = bool(ctx.attr("keepdims", 1))
        last = bool(ctx.attr("select_last_index", 0)) if ctx.version >= 12 else False

        def prep(x):
            if dtype == DType.BOOL:
                return x.to(torch.uint8)
            if dtype in _WIDEN:
                return x.to(torch.int64)
            if dtype == DType.UINT64:
                return x.view(torch.int64) ^ _INT64_MIN
            return x

        def kernel(x):
            ax = normalize_axis(axis, x.dim())
            v = prep(x)
            if not last:
                return fn(v, ax, keepdim=keep)
            n = v.shape[ax]
            return (n - 1) - fn(v.flip(ax), ax, keepdim=keep)
        return kernel


_make_arg("ArgMax", torch.argmax)
_make_arg("ArgMin", torch.argmin)
