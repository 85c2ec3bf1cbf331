"""Padding: Pad (constant / reflect / edge / wrap; pads as attribute before opset 11, as input
after; ``axes`` input from opset 18; negative pads crop) and CenterCropPad.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._tensor_util import dtype_or_none, runtime_ints, unsigned_safe
from .common import const_ints, normalize_axis
from .registry import FusionKind, Movement, NodeContext, register
from .value_range import Fact, number_fact, union
from .run_limits import check_tensor

_MODES = ("constant", "reflect", "edge", "wrap")


def _full_pads(pads: list[int], axes: list[int] | None, rank: int) -> tuple[list[int], list[int]]:
    """(begins, ends) per dim of a rank-``rank`` tensor."""
    if axes is None:
        axes = list(range(rank))
    axes = [normalize_axis(a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad: {len(pads)} pads for {len(axes)} axes (need twice as many)")
    begins, ends = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begins[a] = pads[i]
        ends[a] = pads[len(axes) + i]
    return begins, ends


def _source_index(n_out: int, begin: int, n: int, mode: str, device) -> torch.Tensor:
    j = torch.arange(n_out, device=device) - begin
    if mode == "edge":
        return j.clamp(0, n - 1)
    if mode == "wrap":
        return torch.remainder(j, n)
    if n == 1:
        return torch.zeros_like(j)
    period = 2 * (n - 1)
    j = torch.remainder(j, period)
    return torch.where(j > n - 1, period - j, j)


def apply_pad(x: torch.Tensor, begins, ends, mode: str, value) -> torch.Tensor:
    if any(b < 0 for b in begins) or any(e < 0 for e in ends):
        x = x[tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(zip(begins, ends)))]
        begins = [max(b, 0) for b in begins]
        ends = [max(e, 0) for e in ends]
    if not any(begins) and not any(ends):
        return x
    if mode == "constant":
        flat = []
        for b, e in zip(reversed(begins), reversed(ends)):
            flat += [b, e]
        if x.dtype == torch.bool:
            return F.pad(x.to(torch.uint8), flat, value=int(bool(value))).to(torch.bool)
        return F.pad(x, flat, value=value)
    for axis, (b, e) in enumerate(zip(begins, ends)):
        if b or e:
            n = x.shape[axis]
            if n == 0:
                raise ValueError(f"Pad mode {mode!r} cannot pad an empty axis {axis}")
            x = x.index_select(axis, _source_index(n + b + e, b, n, mode, x.device))
    return x


def _pad_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    pads, axes, known = _pad_params(ctx)
    if s is None or not known:
        return [(dt, None if s is None else (None,) * len(s))]
    begins, ends = _full_pads(pads, axes, len(s))
    return [(dt, tuple(d + b + e if isinstance(d, int) else (d if b == e == 0 else None)
                       for d, b, e in zip(s, begins, ends)))]


def _pad_params(ctx: NodeContext):
    """(pads, axes, known): known is False when pads or axes arrive at run time."""
    if ctx.version < 11:
        pads = ctx.attr("pads", None) or ctx.attr("paddings", None)
        return [int(p) for p in pads], None, True
    pads = const_ints(ctx, 1)
    axes = None
    known = pads is not None
    if ctx.version >= 18 and ctx.has_input(3):
        axes = const_ints(ctx, 3)
        known = known and axes is not None
    return pads, axes, known


def _pad_range(node, ins: list[Fact]) -> list[Fact]:
    """The input's elements and, in constant mode, the fill (attribute ``value`` before opset
    11, input 2 after: absent, 0)."""
    mode = node.attrs.get("mode", "constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return [ins[0]]
    if node.version < 11:
        fill = number_fact(float(node.attrs.get("value", 0.0)))
    else:
        fill = ins[2] if len(ins) > 2 else Fact(0.0)
    return [union(ins[0], fill)]


@register("Pad", since=2, fusion=FusionKind.INJECTIVE, infer=_pad_infer, layout_sensitive=True,
          movement=Movement.PAD, value_range=_pad_range)
def _pad(ctx: NodeContext):
    mode = ctx.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in _MODES or (mode == "wrap" and ctx.version < 19):
        raise ctx.unsupported(f"mode {mode!r}")
    pads, axes, known = _pad_params(ctx)
    value = 0
    value_known = True
    if ctx.version < 11:
        value = float(ctx.attr("value", 0.0))
        if ctx.dtype(0).is_integer or ctx.dtype(0).name == "BOOL":
            value = int(value)
    elif ctx.has_input(2):
        c = ctx.const(2)
        value_known = c is not None
        value = c.reshape(-1)[0].item() if value_known and c.numel() else 0

    limits, node = ctx.limits, ctx.node

    def kernel(x, p=None, v=None, a=None):
        pp, aa = (pads, axes) if known else (runtime_ints(p), runtime_ints(a))
        val = value if value_known else (v.reshape(-1)[0].item() if v.numel() else 0)
        begins, ends = _full_pads(pp, aa, x.dim())
        if not known:
            check_tensor(limits, node, [max(0, d + b + e) for d, b, e in zip(x.shape, begins, ends)], x.dtype)
        return apply_pad(x, begins, ends, mode, val)
    return unsigned_safe(ctx, kernel) if mode != "constant" else kernel


# ---------------------------------------------------------------- CenterCropPad

def _center_crop_pad_params(shape, target, axes):
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [normalize_axis(int(a), rank) for a in axes]
    if len(target) != len(axes):
        raise ValueError(f"CenterCropPad: {len(target)} target dims for {len(axes)} axes")
    begins, ends = [0] * rank, [0] * rank
    for a, t in zip(axes, target):
        diff = t - shape[a]
        if diff >= 0:  # pad: the odd pixel goes to the end
            begins[a], ends[a] = diff // 2, diff - diff // 2
        else:  # crop: the window starts rounded down
            d = -diff
            begins[a], ends[a] = -(d // 2), -(d - d // 2)
    return begins, ends


def _ccp_infer(ctx: NodeContext):
    dt = dtype_or_none(ctx)
    s = ctx.shape(0)
    target = const_ints(ctx, 1)
    if s is None:
        return [(dt, None)]
    if target is None:
        return [(dt, (None,) * len(s))]
    axes = ctx.attr("axes", None)
    axes = list(range(len(s))) if axes is None else [normalize_axis(int(a), len(s)) for a in axes]
    out = list(s)
    for a, t in zip(axes, target):
        out[a] = t
    return [(dt, tuple(out))]


@register("CenterCropPad", since=18, fusion=FusionKind.INJECTIVE, infer=_ccp_infer, layout_sensitive=True)
def _center_crop_pad(ctx: NodeContext):
    target = const_ints(ctx, 1)
    axes = ctx.attr("axes", None)

    def kernel(x, t=None):
        tt = target if target is not None else runtime_ints(t)
        begins, ends = _center_crop_pad_params(x.shape, tt, axes)
        return apply_pad(x, begins, ends, "constant", 0)
    return kernel
