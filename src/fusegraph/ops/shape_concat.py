"""Joining and splitting along one axis: Concat and Split (attribute, input or ``num_outputs``)."""
from __future__ import annotations

import torch

from ._tensor_util import dtype_or_none, ints_input_or_attr, runtime_ints
from .common import normalize_axis
from .registry import FusionKind, Movement, NodeContext, register


def _concat_infer(ctx: NodeContext):
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has_input(i)]
    dt = dtype_or_none(ctx)
    known = [s for s in shapes if s is not None]
    if not known:
        return [(dt, None)]
    rank = len(known[0])
    axis = normalize_axis(int(ctx.attr("axis", 1 if ctx.version < 4 else 0)), rank)
    if len(known) != len(shapes):
        return [(dt, tuple(None if k == axis else known[0][k] for k in range(rank)))]
    total = 0
    for s in shapes:
        d = s[axis]
        if not isinstance(d, int) or total is None:
            total = None
        else:
            total += d
    out = []
    for k in range(rank):
        if k == axis:
            out.append(total)
            continue
        dims = [s[k] for s in shapes]
        ints = [d for d in dims if isinstance(d, int)]
        out.append(ints[0] if ints else (dims[0] if all(d == dims[0] for d in dims) else None))
    return [(dt, tuple(out))]


@register("Concat", since=1, fusion=FusionKind.INJECTIVE, infer=_concat_infer, layout_sensitive=True,
          writes_out=True, movement=Movement.JOIN)
def _concat(ctx: NodeContext):
    axis = int(ctx.attr("axis", 1 if ctx.version < 4 else 0))

    def kernel(*xs, out=None):
        xs = [x for x in xs if x is not None]
        return torch.cat(xs, dim=axis, out=out)
    return kernel


def _split_sizes(dim: int, split, n_out: int, num_outputs) -> list[int]:
    if split is not None:
        if sum(split) != dim:
            raise ValueError(f"Split sizes {split} do not sum to the axis length {dim}")
        return list(split)
    if num_outputs is not None:
        chunk = -(-dim // num_outputs)
        sizes = [min(chunk, max(dim - chunk * k, 0)) for k in range(num_outputs)]
        return sizes
    if dim % n_out:
        raise ValueError(f"Split: axis length {dim} is not divisible into {n_out} equal parts")
    return [dim // n_out] * n_out


def _split_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    n = ctx.n_outputs
    if s is None:
        return [(dt, None)] * n
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(s))
    known, split = ints_input_or_attr(ctx, 1, "split", 13)
    num = ctx.attr("num_outputs", None) if ctx.version >= 18 else None
    dim = s[axis]
    sizes = None
    if known and (split is not None or isinstance(dim, int)):
        sizes = _split_sizes(dim, split, n, num) if split is None else list(split)
    return [(dt, tuple(sizes[k] if j == axis and sizes else (None if j == axis else d)
                       for j, d in enumerate(s))) for k in range(n)]


@register("Split", since=1, fusion=FusionKind.INJECTIVE, infer=_split_infer, layout_sensitive=True,
          movement=Movement.SELECT, writes_out=True)
def _split(ctx: NodeContext):
    """Views of the input's parts, or (``out=``: the outputs' own buffers, one tensor or a
    tuple of them) the parts copied into them: a run whose plan gives the parts their own bytes
    then neither copies them out of the input's bytes afterwards nor keeps those alive."""
    axis = int(ctx.attr("axis", 0))
    known, split = ints_input_or_attr(ctx, 1, "split", 13)
    num = ctx.attr("num_outputs", None) if ctx.version >= 18 else None
    if num is not None and int(num) != ctx.n_outputs:
        raise ctx.unsupported(f"num_outputs={num} but the node has {ctx.n_outputs} outputs")
    n_out = ctx.n_outputs
    num = None if num is None else int(num)

    def kernel(x, s=None, out=None):
        sp = split if known else runtime_ints(s)
        sizes = _split_sizes(x.shape[axis], sp, n_out, num)
        parts = torch.split(x, sizes, dim=axis)
        if out is not None:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for o, p in zip(outs, parts):
                o.copy_(p)
            return tuple(outs) if n_out > 1 else outs[0]
        return tuple(parts) if n_out > 1 else parts[0]
    return kernel
