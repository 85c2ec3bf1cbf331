"""Order-based selection: TopK (stable: equal values keep the lower index first) and Unique
(sorted or in order of first occurrence, with indices, inverse indices and counts).
"""
from __future__ import annotations

import torch

from ..ir import DType
from ._tensor_util import dtype_or_none
from .common import normalize_axis
from .registry import NodeContext, register


def _topk_k(ctx: NodeContext):
    if ctx.version < 10:
        return int(ctx.attr("k"))
    c = ctx.const(1)
    return None if c is None else int(c.reshape(-1)[0])


def _topk_infer(ctx: NodeContext):
    s = ctx.shape(0)
    if s is None:
        return [(dtype_or_none(ctx), None), (DType.INT64, None)]
    a = normalize_axis(int(ctx.attr("axis", -1)), len(s))
    k = _topk_k(ctx)
    shape = tuple(k if i == a else d for i, d in enumerate(s))
    return [(dtype_or_none(ctx), shape), (DType.INT64, shape)]


@register("TopK", since=1, infer=_topk_infer, layout_sensitive=True)
def _topk(ctx: NodeContext):
    axis = int(ctx.attr("axis", -1))
    largest = bool(ctx.attr("largest", 1)) if ctx.version >= 11 else True
    k_const = _topk_k(ctx)
    n_out = ctx.n_outputs

    def kernel(x, k=None):
        kk = k_const if k_const is not None else int(k.reshape(-1)[0].item())
        a = axis + x.dim() if axis < 0 else axis
        if kk < 0 or kk > x.shape[a]:
            raise ValueError(f"TopK: k={kk} is outside [0, {x.shape[a]}]")
        vals, idx = torch.sort(x, dim=a, descending=largest, stable=True)
        vals, idx = vals.narrow(a, 0, kk), idx.narrow(a, 0, kk)
        return (vals, idx) if n_out > 1 else vals
    return kernel


def _unique_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    axis = ctx.attr("axis", None)
    if axis is None or s is None:
        y = (None,)
    else:
        a = normalize_axis(int(axis), len(s))
        y = tuple(None if i == a else d for i, d in enumerate(s))
    if axis is None and s is not None:
        n = 1
        for d in s:
            n = n * d if isinstance(d, int) and isinstance(n, int) else None
        inv = (n,)
    elif s is not None:
        inv = (s[normalize_axis(int(axis), len(s))],)
    else:
        inv = (None,)
    out = [(dt, y), (DType.INT64, (None,)), (DType.INT64, inv), (DType.INT64, (None,))]
    return out[:ctx.n_outputs]


@register("Unique", since=11, infer=_unique_infer, layout_sensitive=True)
def _unique(ctx: NodeContext):
    axis = ctx.attr("axis", None)
    want_sorted = bool(ctx.attr("sorted", 1))
    n_out = ctx.n_outputs

    def kernel(x):
        if axis is None:
            data, dim = x.reshape(-1), 0
            y, inv, counts = torch.unique(data, sorted=True, return_inverse=True, return_counts=True)
        else:
            dim = axis + x.dim() if axis < 0 else axis
            y, inv, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=dim)
        length = inv.shape[0]
        n = y.shape[dim]
        first = torch.full((n,), length, dtype=torch.long, device=x.device).scatter_reduce(
            0, inv, torch.arange(length, device=x.device), "amin", include_self=True)
        if not want_sorted:
            perm = torch.argsort(first)
            rank = torch.empty_like(perm)
            rank[perm] = torch.arange(n, device=x.device)
            y, first, counts, inv = y.index_select(dim, perm), first[perm], counts[perm], rank[inv]
        return (y, first, inv, counts)[:n_out] if n_out > 1 else y
    return kernel
