"""Fused data-movement ops in domain ``fusegraph`` (version 1), made by the movement fusion
rules (``passes/fusion/rules_movement.py``); no frontend creates them.

- ``Roll(x)``: ``torch.roll(x, shifts, axes)``, ``out[i] = x[(i - shift) mod n]`` along each
  axis of ``axes`` (attributes ``shifts``, ``axes``: int lists of one length, distinct axes).
  The exporters write a roll (Swin's cyclic window shift) as a Concat of two Slices per axis;
  here it is one kernel, written straight into the output: one block copy per combination of
  the axes' two parts (2^k strided copies for k axes, one pass over the data in all).
"""
from __future__ import annotations

import itertools

import torch

from .common import normalize_axis
from .registry import FusionKind, Movement, NodeContext, register

DOMAIN = "fusegraph"


def roll_blocks(shape, shifts, axes):
    """For each block: [(axis, destination start, source start, length)] over the rolled axes."""
    parts = []
    for s, a in zip(shifts, axes):
        n = shape[a]
        s = s % n if n else 0
        parts.append([(a, 0, 0, n)] if s == 0 else [(a, s, 0, n - s), (a, 0, n - s, s)])
    return list(itertools.product(*parts))


@register("Roll", domain=DOMAIN, since=1, fusion=FusionKind.INJECTIVE, writes_out=True, movement=Movement.PERMUTE,
          infer=lambda ctx: [(ctx.dtype(0) or None, ctx.shape(0))])
def _roll(ctx: NodeContext):
    shifts = [int(s) for s in ctx.attr("shifts")]
    axes = [int(a) for a in ctx.attr("axes")]
    if len(shifts) != len(axes) or not axes:
        raise ctx.unsupported(f"shifts {shifts} and axes {axes} differ in length or are empty")

    def roll(x, out=None):
        ax = [normalize_axis(a, x.dim()) for a in axes]
        if len(set(ax)) != len(ax):
            raise RuntimeError(f"roll: axes {axes} repeat an axis of a rank-{x.dim()} tensor")
        dst = torch.empty_like(x) if out is None else out
        for block in roll_blocks(tuple(x.shape), shifts, ax):
            d, s = dst, x
            for a, at, src, length in block:
                d, s = d.narrow(a, at, length), s.narrow(a, src, length)
            d.copy_(s)
        return dst
    return roll
