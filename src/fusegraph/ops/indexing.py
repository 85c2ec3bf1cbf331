"""Reading by index: Slice (negative steps, clamped ends), Gather, GatherElements, GatherND,
Compress, NonZero and OneHot.

Negative indices are wrapped as ONNX says; scatter ops live in ``indexing_scatter.py``,
TopK / Unique in ``indexing_sort.py``.
"""
from __future__ import annotations

import torch

from ..ir import DType
from ._tensor_util import DeviceCache, dtype_or_none, runtime_ints, static_dims, unsigned_safe
from .common import const_ints, normalize_axis
from .registry import FusionKind, Movement, NodeContext, register
from .run_limits import check_tensor

INJ = FusionKind.INJECTIVE


# ---------------------------------------------------------------- Slice

def slice_plan(shape, starts, ends, axes, steps):
    """(index tuple, axes to flip afterwards) realising an ONNX Slice on ``shape``."""
    rank = len(shape)
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("Slice: starts, ends, axes and steps differ in length")
    index = [slice(None)] * rank
    flips = []
    for a, s, e, k in zip(axes, starts, ends, steps):
        a = normalize_axis(int(a), rank)
        if k == 0:
            raise ValueError("Slice: step 0")
        # clamping as numpy (and the ONNX reference) does: a start before the beginning
        # selects nothing when stepping backwards
        picked = range(*slice(int(s), int(e), int(k)).indices(int(shape[a])))
        if k > 0:
            index[a] = slice(picked.start, max(picked.stop, picked.start), k)
        elif len(picked) == 0:
            index[a] = slice(0, 0)
        else:
            index[a] = slice(picked[-1], picked[0] + 1, -k)
            flips.append(a)
    return tuple(index), flips


def _apply_slice(x, plan):
    index, flips = plan
    y = x[index]
    return y.flip(flips) if flips else y


def _slice_params(ctx: NodeContext):
    """(known, starts, ends, axes, steps)."""
    if ctx.version < 10:
        ax = ctx.attr("axes", None)
        return (True, [int(v) for v in ctx.attr("starts")], [int(v) for v in ctx.attr("ends")],
                None if ax is None else [int(v) for v in ax], None)
    vals, known = [], True
    for i in range(1, 5):
        if ctx.has_input(i):
            v = const_ints(ctx, i)
            known = known and v is not None
            vals.append(v)
        else:
            vals.append(None)
    return (known, *vals)


def _slice_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    if s is None:
        return [(dt, None)]
    known, starts, ends, axes, steps = _slice_params(ctx)
    if not known:
        return [(dt, (None,) * len(s))]
    out = list(s)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for a, st, e, k in zip(axes, starts, ends, steps):
        a = normalize_axis(int(a), len(s))
        if isinstance(s[a], int):
            index, _ = slice_plan((s[a],), [st], [e], [0], [k])
            out[a] = len(range(s[a])[index[0]])
        else:
            out[a] = s[a] if (st == 0 and k == 1 and e >= 1 << 31) else None
    return [(dt, tuple(out))]


@register("Slice", since=1, fusion=INJ, infer=_slice_infer, layout_sensitive=True, movement=Movement.SELECT)
def _slice(ctx: NodeContext):
    return unsigned_safe(ctx, _slice_kernel(ctx))


def _slice_kernel(ctx: NodeContext):
    known, starts, ends, axes, steps = _slice_params(ctx)
    if not known:
        def dynamic(x, s, e, a=None, st=None):
            return _apply_slice(x, slice_plan(x.shape, runtime_ints(s), runtime_ints(e),
                                              runtime_ints(a), runtime_ints(st)))
        return dynamic
    src = static_dims(ctx, 0)
    if src is not None:
        plan = slice_plan(src, starts, ends, axes, steps)
        return lambda x, *_: _apply_slice(x, plan)
    return lambda x, *_: _apply_slice(x, slice_plan(x.shape, starts, ends, axes, steps))


# ---------------------------------------------------------------- Gather family

def _wrap(idx: torch.Tensor, n) -> torch.Tensor:
    idx = idx.long()
    return torch.where(idx < 0, idx + n, idx)


def _gather_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s, si = ctx.shape(0), ctx.shape(1)
    if s is None or si is None:
        return [(dt, None)]
    a = normalize_axis(int(ctx.attr("axis", 0)), len(s))
    return [(dt, tuple(s[:a]) + tuple(si) + tuple(s[a + 1:]))]


@register("Gather", since=1, fusion=INJ, infer=_gather_infer, layout_sensitive=True, movement=Movement.SELECT)
def _gather(ctx: NodeContext):
    axis = int(ctx.attr("axis", 0))
    const = ctx.const(1)
    src = ctx.shape(0)
    if const is not None and src is not None:
        a = normalize_axis(axis, len(src))
        n = src[a]
        if isinstance(n, int):
            flat = _wrap(const, n).reshape(-1)
            if const.dim() == 0:
                i = int(flat[0])
                return lambda x, *_: x.select(a, i)
            cache = DeviceCache(flat)
            ishape = tuple(const.shape)

            def const_kernel(x, _i=None):
                out = x.index_select(a, cache.get(x.device)[0])
                return out.reshape(x.shape[:a] + ishape + x.shape[a + 1:])
            return unsigned_safe(ctx, const_kernel)

    def kernel(x, idx):
        a = axis + x.dim() if axis < 0 else axis
        out = x.index_select(a, _wrap(idx, x.shape[a]).reshape(-1))
        return out.reshape(x.shape[:a] + idx.shape + x.shape[a + 1:])
    return unsigned_safe(ctx, kernel)


@register("GatherElements", since=11, layout_sensitive=True,
          infer=lambda ctx: [(dtype_or_none(ctx), ctx.shape(1))])
def _gather_elements(ctx: NodeContext):
    axis = int(ctx.attr("axis", 0))

    def kernel(x, idx):
        a = axis + x.dim() if axis < 0 else axis
        return torch.gather(x, a, _wrap(idx, x.shape[a]))
    return unsigned_safe(ctx, kernel)


def gather_nd(x: torch.Tensor, idx: torch.Tensor, b: int) -> torch.Tensor:
    k = idx.shape[-1]
    bshape, q = tuple(x.shape[:b]), tuple(idx.shape[b:-1])
    data_dims, rest = tuple(x.shape[b:b + k]), tuple(x.shape[b + k:])
    bsize = 1
    for d in bshape:
        bsize *= d
    idx = idx.long()
    dims = torch.tensor(data_dims, dtype=torch.long, device=x.device)
    idx = torch.where(idx < 0, idx + dims, idx)
    linear = torch.zeros(idx.shape[:-1], dtype=torch.long, device=x.device)
    for j in range(k):
        linear = linear * data_dims[j] + idx[..., j]
    inner = 1
    for d in data_dims:
        inner *= d
    xr = x.reshape((bsize, inner) + rest)
    lin = linear.reshape(bsize, -1)
    rows = torch.arange(bsize, device=x.device).unsqueeze(1)
    return xr[rows, lin].reshape(bshape + q + rest)


def _gather_nd_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s, si = ctx.shape(0), ctx.shape(1)
    b = int(ctx.attr("batch_dims", 0))
    if s is None or si is None or not isinstance(si[-1], int):
        return [(dt, None)]
    return [(dt, tuple(si[:-1]) + tuple(s[b + si[-1]:]))]


@register("GatherND", since=11, infer=_gather_nd_infer, layout_sensitive=True)
def _gather_nd(ctx: NodeContext):
    b = int(ctx.attr("batch_dims", 0))
    return lambda x, idx: gather_nd(x, idx, b)


# ---------------------------------------------------------------- Compress / NonZero

def _compress_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    axis = ctx.attr("axis", None)
    cond = ctx.const(1)
    if axis is None:
        n = None
        if cond is not None and s is not None and all(isinstance(d, int) for d in s):
            total = 1
            for d in s:
                total *= d
            n = int(cond.reshape(-1)[:total].to(torch.bool).sum())
        return [(dt, (n,))]
    if s is None:
        return [(dt, None)]
    a = normalize_axis(int(axis), len(s))
    n = None
    if cond is not None and isinstance(s[a], int):
        n = int(cond.reshape(-1)[:s[a]].to(torch.bool).sum())
    return [(dt, tuple(n if i == a else d for i, d in enumerate(s)))]


@register("Compress", since=9, infer=_compress_infer, layout_sensitive=True)
def _compress(ctx: NodeContext):
    axis = ctx.attr("axis", None)

    def kernel(x, cond):
        if axis is None:
            x, a = x.reshape(-1), 0
        else:
            a = axis + x.dim() if axis < 0 else axis
        c = cond.reshape(-1)[:x.shape[a]].to(torch.bool)
        return x.index_select(a, torch.nonzero(c).reshape(-1))
    return unsigned_safe(ctx, kernel)


def _nonzero_infer(ctx: NodeContext):
    s = ctx.shape(0)
    return [(DType.INT64, None if s is None else (len(s), None))]


@register("NonZero", since=9, infer=_nonzero_infer, layout_sensitive=True)
def _nonzero(ctx: NodeContext):
    def kernel(x):
        nz = x if x.dtype == torch.bool else x != 0
        if x.dim() == 0:  # rank 0: shape (0, nnz)
            return torch.nonzero(nz.reshape(1)).t()[:0]
        return torch.nonzero(nz).t()
    return kernel


# ---------------------------------------------------------------- OneHot

def _onehot_infer(ctx: NodeContext):
    s = ctx.shape(0)
    dt = dtype_or_none(ctx, 2)
    depth = ctx.const(1)
    if s is None:
        return [(dt, None)]
    d = int(depth.reshape(-1)[0]) if depth is not None else None
    a = normalize_axis(int(ctx.attr("axis", -1)), len(s) + 1)
    out = list(s)
    out.insert(a, d)
    return [(dt, tuple(out))]


@register("OneHot", since=9, infer=_onehot_infer, layout_sensitive=True)
def _onehot(ctx: NodeContext):
    axis = int(ctx.attr("axis", -1))
    c = ctx.const(1)
    depth_c = None if c is None else int(c.reshape(-1)[0].item())
    wrap_negative = ctx.version >= 11
    limits, node = ctx.limits, ctx.node

    def kernel(indices, depth, values):
        d = depth_c if depth_c is not None else int(depth.reshape(-1)[0].item())
        if depth_c is None:
            check_tensor(limits, node, list(indices.shape) + [max(d, 0)], values.dtype)
        idx = indices
        if idx.is_floating_point():
            idx = idx.trunc()
        idx = idx.long()
        if wrap_negative:
            idx = torch.where(idx < 0, idx + d, idx)
        hot = idx.unsqueeze(-1) == torch.arange(d, device=idx.device)
        a = axis + idx.dim() + 1 if axis < 0 else axis
        hot = hot.movedim(-1, a)
        vals = values.reshape(-1)
        return torch.where(hot, vals[1], vals[0])
    return unsigned_safe(ctx, kernel, inputs=(2,)) if ctx.has_input(2) else kernel
