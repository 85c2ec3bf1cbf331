"""``fusegraph::RotaryEmbedding`` and ``fusegraph::GatedActivation`` of bfloat16 / float16 values
(a decoder under ``precision="bf16"``), written into planned memory.

Both compute in float32 and round once, as their ops' own kernels do; those convert every
operand to a fresh float32 tensor on each run, these take one float32 buffer the size of the
result from the backend's per-thread workspace (``workspace.py``): the rotation's products
read the bfloat16 halves directly (ATen promotes them to float32 inside), the gate is copied
into the buffer (exact) and activated and multiplied there; the result is rounded into the
output slot. Float32 nodes need none of this (their own kernels write into ``out=`` in
place): None, the op's own kernel runs.
"""
from __future__ import annotations

import math

import torch

from ....ops.fused_decoder import ACTIVATIONS, rotary_views, rotate_into
from ..protocol import Decline

REDUCED = (torch.bfloat16, torch.float16)


def _reduced(ctx) -> bool:
    v = ctx.node.inputs[0]
    return v is not None and v.dtype is not None and v.dtype.to_torch() in REDUCED


def _float32_buffer(workspace, shape) -> torch.Tensor:
    n = math.prod(shape)
    return workspace.at_least(4 * max(n, 1))[:4 * n].view(torch.float32).view(shape)


def rotary_kernel(ctx, workspace):
    if not _reduced(ctx):
        return None
    heads = int(ctx.attr("heads", 0))
    if heads < 0:
        return Decline(f"heads={heads}", "cpu")

    def rotary(x, cos, sin, out=None):
        dst = torch.empty(x.shape, dtype=x.dtype) if out is None else out
        xv, c, s = rotary_views(x, cos, sin, heads)
        if xv.shape[-1] % 2:
            raise RuntimeError(f"rotary embedding: the rotated axis {xv.shape[-1]} is odd")
        y = rotate_into(xv, c.float(), s.float(), _float32_buffer(workspace, tuple(xv.shape)))
        rotary_views(dst, cos, sin, heads)[0].copy_(y)
        return dst
    rotary.writes_out = True
    return rotary


def gated_kernel(ctx, workspace):
    if not _reduced(ctx):
        return None
    act = ACTIVATIONS.get(ctx.attr("activation"))
    if act is None:
        return Decline(f"activation {ctx.attr('activation')!r}", "cpu")

    def gated(x, out=None):
        if x.shape[-1] % 2:
            raise RuntimeError(f"gated activation: the last axis {x.shape[-1]} is odd")
        n = x.shape[-1] // 2
        shape = tuple(x.shape[:-1]) + (n,)
        y = _float32_buffer(workspace, shape)
        y.copy_(x[..., :n])
        act(y, y)
        y.mul_(x[..., n:])
        return y.to(x.dtype) if out is None else out.copy_(y)
    gated.writes_out = True
    return gated
