"""Attention (opset 23+): scaled dot-product attention with masks, KV cache, GQA and softcap.

One kernel covers 3-D and 4-D inputs, q/kv head counts (GQA / MQA), ``is_causal`` with the
offset-aware (bottom-right) frontier, sliding windows, bool or float ``attn_mask`` (padded
when shorter than the key length), ``past_key``/``past_value`` with the ``present_*``
outputs, ``nonpad_kv_seqlen`` (external cache), ``scale``, ``softcap``,
``softmax_precision`` and the optional ``qk_matmul_output`` (modes 0-3).

A fully-masked query row yields a zero row (never NaN), decided on the additive bias.
When no softcap, no 4th output and no softmax up-cast is asked for, the kernel calls
``torch.nn.functional.scaled_dot_product_attention`` (the fused kernel fusions target);
otherwise it composes the same math from torch ops. FlexAttention lives in
``flex_attention.py``; RotaryEmbedding, LinearAttention, SwiGLU in ``attention_variants.py``.
"""
from __future__ import annotations

import math
import struct

import torch
import torch.nn.functional as F

from ..ir import DType
from .registry import FusionKind, NodeContext, register

_SOFTMAX_TYPES = {DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16}


def softmax_dtype(ctx: NodeContext, code) -> torch.dtype | None:
    """The torch dtype of a ``softmax_precision`` attribute (None when absent)."""
    if code is None:
        return None
    try:
        dt = DType(int(code))
    except ValueError:
        dt = None
    if dt not in _SOFTMAX_TYPES:
        raise ctx.unsupported(f"softmax_precision={code} (expected FLOAT, FLOAT16, DOUBLE or "
                              f"BFLOAT16)")
    return dt.to_torch()


def round_scalar(x: float, dtype: torch.dtype) -> float:
    """``x`` rounded to ``dtype`` (as numpy's ``dtype.type(x)`` does), computed on the host."""
    if dtype == torch.float16:
        return struct.unpack("<e", struct.pack("<e", x))[0]
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    if dtype == torch.float32:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    return float(x)


def safe_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis that maps an all ``-inf`` row to zeros instead of NaN."""
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros((), dtype=x.dtype, device=x.device), m)
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    s = torch.where(s == 0, torch.ones((), dtype=x.dtype, device=x.device), s)
    return e / s


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, H*D) -> (B, H, T, D)."""
    b, t = x.shape[0], x.shape[1]
    return x.reshape(b, t, heads, -1).transpose(1, 2)


def _attention_bias(mask, mask_is_bool, L, S, dtype, device, causal, left, right, past_len, nonpad):
    """The additive bias (None when nothing masks) and the fully-masked-row guard.

    Mirrors the ONNX reference: positions disallowed by a bool mask, the causal frontier, the
    window or the padding get ``-inf``; a float mask is added where allowed.
    """
    if mask is not None and mask.shape[-1] < S:
        pad = S - mask.shape[-1]
        if mask_is_bool:
            mask = F.pad(mask, (0, pad), value=False)
        else:
            mask = F.pad(mask, (0, pad), value=-math.inf)
    allowed = mask if (mask is not None and mask_is_bool) else None
    add = None if (mask is None or mask_is_bool) else mask.to(dtype)

    windowed = left >= 0 or right >= 0
    if causal or windowed:
        i = torch.arange(L, device=device).reshape(L, 1)
        j = torch.arange(S, device=device).reshape(1, S)
        if nonpad is not None and past_len is None:
            off = (nonpad.to(torch.int64).reshape(-1, 1, 1, 1) - L)   # per batch (B, 1, 1, 1)
            diff = i + off - j                                         # (B, 1, L, S)
        else:
            diff = i + (past_len or 0) - j                             # (L, S)
        frontier = None
        if causal:
            frontier = diff >= 0
        if left >= 0:
            c = diff <= left
            frontier = c if frontier is None else frontier & c
        if right >= 0:
            c = -diff <= right
            frontier = c if frontier is None else frontier & c
        allowed = frontier if allowed is None else allowed & frontier
    if nonpad is not None:
        j = torch.arange(S, device=device)
        pad_ok = (j < nonpad.to(torch.int64).reshape(-1, 1)).reshape(-1, 1, 1, S)
        allowed = pad_ok if allowed is None else allowed & pad_ok

    if allowed is None:
        if add is None:
            return None, None
        bias = add
    else:
        zero = torch.zeros((), dtype=dtype, device=device)
        ninf = torch.full((), -math.inf, dtype=dtype, device=device)
        bias = torch.where(allowed, zero if add is None else add, ninf)
    guard = torch.isneginf(bias.amax(-1, keepdim=True))
    return bias, guard


def _attention_infer(ctx: NodeContext):
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    dt = ctx.dtype(0) or None
    if q is None or k is None or v is None:
        return [(dt, None)] * ctx.n_outputs
    past = ctx.shape(4) if ctx.has_input(4) else None

    def plus(a, b):
        return a + b if isinstance(a, int) and isinstance(b, int) else None

    if len(q) == 3:
        hq, hkv = ctx.attr("q_num_heads", None), ctx.attr("kv_num_heads", None)
        if not hq or not hkv:
            return [(dt, None)] * ctx.n_outputs
        dk = k[2] // hkv if isinstance(k[2], int) else None
        dv = v[2] // hkv if isinstance(v[2], int) else None
        y = (q[0], q[1], dv * hq if dv is not None else None)
        b, L, kv_len = q[0], q[1], k[1]
    else:
        hq, hkv, dk, dv = q[1], k[1], k[3], v[3]
        y = (q[0], q[1], q[2], v[3])
        b, L, kv_len = q[0], q[2], k[2]
    total = kv_len if past is None else plus(past[2], kv_len)
    outs = [(dt, y), (dt, (b, hkv, total, dk)), (dt, (b, hkv, total, dv)), (dt, (b, hq, L, total))]
    return outs[:ctx.n_outputs]


@register("Attention", since=23, infer=_attention_infer, fusion=FusionKind.OPAQUE)
def _attention(ctx: NodeContext):
    causal = bool(ctx.attr("is_causal", 0))
    scale_attr = ctx.attr("scale", None)
    hq_attr, hkv_attr = ctx.attr("q_num_heads", None), ctx.attr("kv_num_heads", None)
    softcap = float(ctx.attr("softcap", 0.0) or 0.0)
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    sp = softmax_dtype(ctx, ctx.attr("softmax_precision", None))
    n_out = ctx.n_outputs
    if mode not in (0, 1, 2, 3):
        raise ctx.unsupported(f"qk_matmul_output_mode={mode}")
    if left < -1 or right < -1:
        raise ctx.unsupported("window sizes must be -1 or nonnegative")
    if ctx.has_input(4) != ctx.has_input(5):
        raise ctx.unsupported("past_key and past_value must be given together")
    if ctx.has_input(6) and ctx.has_input(4):
        raise ctx.unsupported("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    q_shape = ctx.shape(0)
    if q_shape is not None and len(q_shape) == 3 and not (hq_attr and hkv_attr):
        raise ctx.unsupported("3-D inputs need q_num_heads and kv_num_heads")
    in_dt = ctx.dtype(0)
    if in_dt not in (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16, DType.UNDEFINED):
        raise ctx.unsupported(f"input dtype {in_dt.name}")
    mask_is_bool = ctx.has_input(3) and ctx.dtype(3) == DType.BOOL
    # The fused kernel where it computes the ONNX math: no softcap, no 4th output, softmax in
    # the input type. Not for float16: SDPA accumulates in float32 and lands ~1 ulp off the
    # float16 op-by-op result, beyond rtol 1e-3 (bfloat16 is well inside its tolerance).
    fused = (softcap <= 0 and n_out < 4 and in_dt not in (DType.FLOAT16, DType.UNDEFINED)
             and (sp is None or sp == in_dt.to_torch()))

    def kernel(Q, K, V, mask=None, past_k=None, past_v=None, nonpad=None):
        three_d = Q.dim() == 3
        if three_d:
            Q, K, V = split_heads(Q, hq_attr), split_heads(K, hkv_attr), split_heads(V, hkv_attr)
        past_len = None
        if past_k is not None:
            past_len = past_k.shape[2]
            K = torch.cat([past_k, K], dim=2)
            V = torch.cat([past_v, V], dim=2)
        present_k, present_v = K, V
        dtype, device = Q.dtype, Q.device
        L, S = Q.shape[2], K.shape[2]
        scale = scale_attr if scale_attr is not None else 1.0 / math.sqrt(Q.shape[3])
        bias, guard = _attention_bias(mask, mask_is_bool, L, S, dtype, device, causal, left, right,
                                      past_len, nonpad)
        gqa = Q.shape[1] != K.shape[1]
        if fused:
            m = bias if bias is None or bias.dim() >= 2 else bias.reshape(1, -1)
            y = F.scaled_dot_product_attention(Q, K, V, attn_mask=m, scale=scale, enable_gqa=gqa)
            if guard is not None:
                y = torch.where(guard, torch.zeros((), dtype=y.dtype, device=device), y)
            return _finish(y, three_d, present_k, present_v, None)
        if gqa:
            rep = Q.shape[1] // K.shape[1]
            K = K.repeat_interleave(rep, dim=1)
            V = V.repeat_interleave(rep, dim=1)
        sq = round_scalar(math.sqrt(scale), dtype)
        qk = torch.matmul(Q * sq, (K * sq).transpose(-1, -2))
        if softcap > 0:
            qk = torch.tanh(qk / softcap) * softcap
        qk_out = qk
        qkb = qk if bias is None else qk + bias
        if mode == 2:
            qk_out = qkb
        if sp is not None:
            qkb = qkb.to(sp)
        p = safe_softmax(qkb)
        if guard is not None:
            p = torch.where(guard, torch.zeros((), dtype=p.dtype, device=device), p)
        if mode == 3:
            qk_out = p
        y = torch.matmul(p.to(dtype), V)
        return _finish(y, three_d, present_k, present_v, qk_out.to(dtype) if n_out >= 4 else None)

    def _finish(y, three_d, present_k, present_v, qk_out):
        if three_d:
            y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
        if n_out == 1:
            return y
        outs = (y, present_k, present_v, qk_out)
        return outs[:n_out]

    return kernel
