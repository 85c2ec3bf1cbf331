"""Attention building blocks beside Attention itself: RotaryEmbedding (23), LinearAttention (27)
and SwiGLU (28).

RotaryEmbedding rotates halves (or interleaved pairs) of each head by cos/sin caches gathered
at ``position_ids``; LinearAttention runs the linear / gated / delta / gated-delta recurrence
token by token in float32 (as the ONNX reference does); SwiGLU is ``A * sigmoid(alpha*A) * B``.
"""
from __future__ import annotations

import math

import torch

from ..ir import DType
from .attention import split_heads
from .common import same_as_input
from .registry import FusionKind, NodeContext, register

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16, DType.UNDEFINED)


@register("RotaryEmbedding", since=23, infer=same_as_input(0), fusion=FusionKind.OPAQUE)
def _rotary_embedding(ctx: NodeContext):
    interleaved = bool(ctx.attr("interleaved", 0))
    rot_dim_attr = int(ctx.attr("rotary_embedding_dim", 0) or 0)
    num_heads = ctx.attr("num_heads", None)
    shape = ctx.shape(0)
    if shape is not None and len(shape) == 3 and not num_heads:
        raise ctx.unsupported("3-D input needs the num_heads attribute")
    if shape is not None and len(shape) not in (3, 4):
        raise ctx.unsupported(f"input rank {len(shape)} (expected 3 or 4)")

    def kernel(x, cos, sin, pos=None):
        orig = x.shape
        if x.dim() == 4:                       # (B, H, T, D) -> (B, T, H, D)
            x = x.transpose(1, 2)
        else:                                  # (B, T, H*D) -> (B, T, H, D)
            x = x.reshape(orig[0], orig[1], num_heads, -1)
        rot = rot_dim_attr or x.shape[3]
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        if pos is not None:
            cos, sin = cos[pos.to(torch.int64)], sin[pos.to(torch.int64)]
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        if interleaved:
            x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        else:
            x1, x2 = x_rot[..., :rot // 2], x_rot[..., rot // 2:]
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if interleaved:
            rotated = torch.stack((real, imag), dim=-1).reshape(x_rot.shape)
        else:
            rotated = torch.cat((real, imag), dim=-1)
        y = torch.cat((rotated.to(x.dtype), x_pass), dim=-1)
        if len(orig) == 3:
            return y.reshape(orig)
        return y.transpose(1, 2)

    return kernel


@register("SwiGLU", since=28, infer=same_as_input(0), fusion=FusionKind.BROADCAST)
def _swiglu(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 1.0))
    if ctx.dtype(0) not in _FLOATS:
        raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
    if alpha == 1.0:
        return lambda a, b: a * torch.sigmoid(a) * b
    return lambda a, b: a * torch.sigmoid(a * alpha) * b


_RULES = ("linear", "gated", "delta", "gated_delta")


def _linear_attention_infer(ctx: NodeContext):
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    hq, hkv = ctx.attr("q_num_heads", None), ctx.attr("kv_num_heads", None)
    dt = ctx.dtype(0) or None
    state_dt = (ctx.dtype(3) or None) if ctx.has_input(3) else dt
    if q is None or k is None or v is None or not hq or not hkv:
        return [(dt, None), (state_dt, None)][:ctx.n_outputs]
    dk = q[2] // hq if isinstance(q[2], int) else None
    dv = v[2] // hkv if isinstance(v[2], int) else None
    y = (q[0], q[1], dv * hq if dv is not None else None)
    return [(dt, y), (state_dt, (q[0], hkv, dk, dv))][:ctx.n_outputs]


@register("LinearAttention", since=27, infer=_linear_attention_infer, fusion=FusionKind.OPAQUE)
def _linear_attention(ctx: NodeContext):
    rule = ctx.attr("update_rule", "gated_delta")
    hq, hkv = ctx.attr("q_num_heads", None), ctx.attr("kv_num_heads", None)
    scale_attr = float(ctx.attr("scale", 0.0) or 0.0)
    if rule not in _RULES:
        raise ctx.unsupported(f"update_rule={rule!r} (expected one of {', '.join(_RULES)})")
    if not hq or not hkv or hq <= 0 or hkv <= 0 or hq % hkv != 0:
        raise ctx.unsupported("q_num_heads must be a positive multiple of kv_num_heads")
    gating = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    if gating != ctx.has_input(4):
        raise ctx.unsupported(f"update_rule {rule!r} {'requires' if gating else 'forbids'} decay")
    if delta != ctx.has_input(5):
        raise ctx.unsupported(f"update_rule {rule!r} {'requires' if delta else 'forbids'} beta")
    group = hq // hkv
    f32 = torch.float32

    def kernel(query, key, value, past=None, decay=None, beta=None):
        b, t = query.shape[0], query.shape[1]
        dk = query.shape[2] // hq
        dv = value.shape[2] // hkv
        q4 = split_heads(query, hq).to(f32)
        k4 = split_heads(key, hkv).to(f32)
        v4 = split_heads(value, hkv).to(f32)
        if decay is not None:
            if decay.shape[-1] == hkv:               # per-head scalar -> (B, H, T, 1)
                g4 = decay.reshape(b, t, hkv, 1).transpose(1, 2).to(f32)
            else:                                    # per key dim -> (B, H, T, dk)
                g4 = split_heads(decay, hkv).to(f32)
            g4 = torch.exp(g4).unsqueeze(-1)         # (B, H, T, dk|1, 1)
        if beta is not None:
            beta4 = beta.reshape(b, t, beta.shape[-1], 1).transpose(1, 2).to(f32)
        if past is not None:
            state = past.to(f32)
            state_dtype = past.dtype
        else:
            state = torch.zeros((b, hkv, dk, dv), dtype=f32, device=query.device)
            state_dtype = query.dtype
        scale = scale_attr if scale_attr != 0.0 else 1.0 / math.sqrt(dk)
        outs = []
        for i in range(t):
            k_t, v_t = k4[:, :, i, :], v4[:, :, i, :]
            if gating:
                state = state * g4[:, :, i]
            if delta:
                retrieved = torch.einsum("bhdm,bhd->bhm", state, k_t)
                v_t = beta4[:, :, i, :] * (v_t - retrieved)
            state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
            read = state if group == 1 else state.repeat_interleave(group, dim=1)
            outs.append(torch.einsum("bhd,bhdm->bhm", q4[:, :, i, :], read) * scale)
        out = torch.stack(outs, dim=2) if outs else q4.new_zeros((b, hq, 0, dv))
        out = out.transpose(1, 2).reshape(b, t, hq * dv).to(query.dtype)
        return out, state.to(state_dtype)

    return kernel
