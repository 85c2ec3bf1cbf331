"""Writing by index: ScatterElements (and the deprecated Scatter), ScatterND, TensorScatter.

Every kernel is functional: it returns an updated copy and never writes into its inputs.
Reductions none / add / mul / max / min map onto torch scatter_reduce / index_reduce.
"""
from __future__ import annotations

import torch

from ._tensor_util import unsigned_safe
from .common import same_as_input
from .registry import NodeContext, register

_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(ctx: NodeContext, min_version_minmax: int = 18) -> str:
    red = ctx.attr("reduction", "none")
    if red not in ("none", "add", "mul", "max", "min"):
        raise ctx.unsupported(f"reduction {red!r}")
    if red in ("max", "min") and ctx.version < min_version_minmax:
        raise ctx.unsupported(f"reduction {red!r} needs opset {min_version_minmax}")
    if red != "none" and ctx.dtype(0).name == "BOOL":
        raise ctx.unsupported(f"reduction {red!r} on bool data")
    return red


def _wrap(idx: torch.Tensor, n) -> torch.Tensor:
    idx = idx.long()
    return torch.where(idx < 0, idx + n, idx)


@register("ScatterElements", since=11, infer=same_as_input(0), layout_sensitive=True)
def _scatter_elements(ctx: NodeContext):
    axis = int(ctx.attr("axis", 0))
    red = _reduction(ctx)

    def kernel(x, idx, upd):
        a = axis + x.dim() if axis < 0 else axis
        i = _wrap(idx, x.shape[a])
        if red == "none":
            return x.scatter(a, i, upd)
        return x.scatter_reduce(a, i, upd, _SCATTER_REDUCE[red], include_self=True)
    return unsigned_safe(ctx, kernel, inputs=(0, 2), ordered=red in ("max", "min"))


@register("Scatter", since=9, infer=same_as_input(0), layout_sensitive=True)
def _scatter(ctx: NodeContext):
    axis = int(ctx.attr("axis", 0))

    def kernel(x, idx, upd):
        a = axis + x.dim() if axis < 0 else axis
        return x.scatter(a, _wrap(idx, x.shape[a]), upd)
    return unsigned_safe(ctx, kernel, inputs=(0, 2))


def scatter_nd(x: torch.Tensor, idx: torch.Tensor, upd: torch.Tensor, red: str) -> torch.Tensor:
    k = idx.shape[-1]
    data_dims, rest = tuple(x.shape[:k]), tuple(x.shape[k:])
    idx = idx.long()
    dims = torch.tensor(data_dims, dtype=torch.long, device=x.device)
    idx = torch.where(idx < 0, idx + dims, idx)
    linear = torch.zeros(idx.shape[:-1], dtype=torch.long, device=x.device)
    for j in range(k):
        linear = linear * data_dims[j] + idx[..., j]
    inner = 1
    for d in data_dims:
        inner *= d
    out = x.reshape((inner,) + rest).clone()
    lin = linear.reshape(-1)
    u = upd.reshape((lin.shape[0],) + rest).to(x.dtype)
    if red == "none":
        out.index_copy_(0, lin, u)
    elif red == "add":
        out.index_add_(0, lin, u)
    else:
        out.index_reduce_(0, lin, u, _SCATTER_REDUCE[red], include_self=True)
    return out.reshape(x.shape)


@register("ScatterND", since=11, infer=same_as_input(0), layout_sensitive=True)
def _scatter_nd(ctx: NodeContext):
    red = _reduction(ctx)
    return unsigned_safe(ctx, lambda x, idx, upd: scatter_nd(x, idx, upd, red), inputs=(0, 2),
                         ordered=red in ("max", "min"))


@register("TensorScatter", since=24, infer=same_as_input(0), layout_sensitive=True)
def _tensor_scatter(ctx: NodeContext):
    axis = int(ctx.attr("axis", -2))
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode {mode!r}")

    def kernel(past, update, write_indices=None):
        rank = past.dim()
        a = axis + rank if axis < 0 else axis
        if a == 0:
            raise ValueError("TensorScatter: axis 0 is the batch axis")
        batch, seq, max_seq = past.shape[0], update.shape[a], past.shape[a]
        pos = torch.arange(seq, device=past.device)
        if write_indices is None:
            start = torch.zeros(batch, dtype=torch.long, device=past.device)
        else:
            start = write_indices.long().reshape(-1)
        idx = start.unsqueeze(1) + pos.unsqueeze(0)
        if mode == "circular":
            idx = torch.remainder(idx, max_seq)
        shape = [1] * rank
        shape[0], shape[a] = batch, seq
        idx = idx.reshape(shape).expand(update.shape)
        return past.scatter(a, idx, update)
    return unsigned_safe(ctx, kernel, inputs=(0, 1))
