"""Quantization: QuantizeLinear, DequantizeLinear (per-tensor, per-axis, blocked; 8/16-bit
integers and float8), DynamicQuantizeLinear, QLinearMatMul, QLinearConv.

Rounding is half-to-even (``torch.round``), integer results saturate to the output type.
4-bit and 2-bit types have no torch dtype and are refused at build time. Integer products
are summed exactly in floats (see ``conv.int_conv`` / ``linalg.int_matmul``) and requantized
in float64 as the reference does.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from ..ir import DType
from .conv import ConvGeometry, check_rank, int_conv
from .linalg import matmul_shape, int_matmul
from .registry import FusionKind, NodeContext, register
from .value_range import UNKNOWN, Fact

_INT_RANGE = {
    DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.INT16: (-32768, 32767),
    DType.UINT16: (0, 65535), DType.INT32: (-(2 ** 31), 2 ** 31 - 1),
}
# float8: (largest finite, |x| from which a non-saturating cast overflows, value it gives)
_F8 = {
    DType.FLOAT8E4M3FN: (448.0, 464.0, False, float("nan")),
    DType.FLOAT8E4M3FNUZ: (240.0, 248.0, True, float("nan")),
    DType.FLOAT8E5M2: (57344.0, 61440.0, True, float("inf")),
    DType.FLOAT8E5M2FNUZ: (57344.0, 61440.0, True, float("nan")),
}


def _torch_type(ctx: NodeContext, dt: DType, what: str) -> torch.dtype:
    try:
        return dt.to_torch()
    except TypeError:
        raise ctx.unsupported(f"{what} type {dt.name} has no torch equivalent") from None


def expand_param(p, x, axis: int, block: int):
    """Scale / zero point made broadcastable to x: per-tensor, per-axis or blocked."""
    if p.numel() == 1:
        return p.reshape(())
    a = axis + x.dim() if axis < 0 else axis
    if block > 0:
        return p.repeat_interleave(block, dim=a).narrow(a, 0, x.shape[a])
    return p.reshape((1,) * a + (-1,) + (1,) * (x.dim() - a - 1))


# ----------------------------------------------------------------------------- QuantizeLinear
def _q_out_type(ctx: NodeContext) -> DType:
    if ctx.has_input(2) and ctx.dtype(2):
        return ctx.dtype(2)
    code = int(ctx.attr("output_dtype", 0))
    return DType(code) if code else DType.UINT8


def _q_infer(ctx: NodeContext):
    return [(_q_out_type(ctx), ctx.shape(0))]


def saturate_int(y, dt: DType, out: torch.dtype):
    lo, hi = _INT_RANGE[dt]
    return y.clamp(lo, hi).to(out)


def to_float8(y, dt: DType, out: torch.dtype, saturate: bool):
    fmax, overflow, at_tie, special = _F8[dt]
    if saturate:
        return y.clamp(-fmax, fmax).to(out)
    big = y.abs() >= overflow if at_tie else y.abs() > overflow
    return torch.where(big, y * special, y).to(out)


@register("QuantizeLinear", since=10, fusion=FusionKind.OPAQUE, infer=_q_infer)
def _quantize_linear(ctx: NodeContext):
    axis = int(ctx.attr("axis", 1))
    block = int(ctx.attr("block_size", 0))
    saturate = bool(ctx.attr("saturate", 1))
    prec_code = int(ctx.attr("precision", 0))
    prec = _torch_type(ctx, DType(prec_code), "precision") if prec_code else None
    dt = _q_out_type(ctx)
    if dt not in _INT_RANGE and dt not in _F8:
        raise ctx.unsupported(f"output type {dt.name}")
    out = _torch_type(ctx, dt, "output")

    def quantize(x, scale, zp=None):
        s = expand_param(scale, x, axis, block)
        y = x.to(prec) / s.to(prec) if prec is not None else x / s
        if dt in _F8:
            return to_float8(y, dt, out, saturate)
        y = torch.round(y)
        if zp is not None:
            y = y + expand_param(zp, x, axis, block).to(y.dtype)
        return saturate_int(y, dt, out)
    return quantize


# ----------------------------------------------------------------------------- DequantizeLinear
def _dq_out_type(ctx: NodeContext) -> DType:
    code = int(ctx.attr("output_dtype", 0))
    if code:
        return DType(code)
    if ctx.version < 19:
        return DType.FLOAT
    return ctx.dtype(1) or DType.FLOAT


def _dq_infer(ctx: NodeContext):
    return [(_dq_out_type(ctx), ctx.shape(0))]


def _dq_range(node, ins: list[Fact]) -> list[Fact]:
    """``(x - zp) * scale`` of an integer ``x``: at most the type's width (its largest
    magnitude without a zero point) times the largest scale; NaN where a scale is NaN or
    infinite (inf times 0). A float8 or 4-bit input: unknown."""
    span = _INT_RANGE.get(node.inputs[0].dtype)
    if span is None or len(ins) < 2:
        return [UNKNOWN]
    lo, hi = span
    width = float(hi - lo) if len(node.inputs) > 2 and node.inputs[2] is not None else float(max(-lo, hi))
    s = ins[1]
    return [Fact(width * s.bound, s.nan or s.inf, s.inf)]


@register("DequantizeLinear", since=10, fusion=FusionKind.OPAQUE, infer=_dq_infer, value_range=_dq_range)
def _dequantize_linear(ctx: NodeContext):
    axis = int(ctx.attr("axis", 1))
    block = int(ctx.attr("block_size", 0))
    xt = ctx.dtype(0)
    if xt and xt not in _INT_RANGE and xt not in _F8:
        raise ctx.unsupported(f"input type {xt.name}")
    if ctx.dtype(1) and ctx.dtype(1) not in (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16):
        raise ctx.unsupported(f"scale type {ctx.dtype(1).name}")
    out = _torch_type(ctx, _dq_out_type(ctx), "output")
    is_f8 = xt in _F8

    def dequantize(x, scale, zp=None):
        dx = x.to(torch.float32)
        if zp is not None and not is_f8:
            dx = dx - expand_param(zp, x, axis, block).to(torch.float32)
        return (dx * expand_param(scale, x, axis, block).to(torch.float32)).to(out)
    return dequantize


# ----------------------------------------------------------------------------- DynamicQuantizeLinear
def _dyn_infer(ctx: NodeContext):
    return [(DType.UINT8, ctx.shape(0)), (ctx.dtype(0) or None, ()), (DType.UINT8, ())]


_SCRATCH = threading.local()     # per thread: float32 and int32 buffers of the largest input quantised


def _scratch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    got = getattr(_SCRATCH, "bufs", None)
    if got is None or got[0].numel() < n:
        with torch.inference_mode(False):
            got = _SCRATCH.bufs = (torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=torch.int32))
    return got[0][:n], got[1][:n]


def dynamic_quantize_params(lo: float, hi: float) -> tuple[np.float32, float]:
    """DynamicQuantizeLinear's (scale, zero point) from its input's min and max, in float32
    exactly as the ONNX reference computes them (range widened to include 0; scale 1/255
    when the range is empty; zero point clipped to [0, 255], then rounded half to even)."""
    maxx, minx = np.float32(max(0.0, hi)), np.float32(min(0.0, lo))
    scale = np.float32(1.0 if maxx == minx else (maxx - minx)) / np.float32(255)
    zp = max(0, min(255, np.float32(0) - minx / scale))
    return scale, float(np.rint(zp))


@register("DynamicQuantizeLinear", since=11, fusion=FusionKind.OPAQUE, infer=_dyn_infer)
def _dynamic_quantize_linear(ctx: NodeContext):
    """One pass for the range (``aminmax``), the scalars in float32 as the reference does,
    then ``round(x / scale) + zero point`` saturated, through float32 / int32 buffers shared
    by every such node of the thread (true division: a reciprocal would round differently)."""
    def dynamic_quantize(x):
        xf = x if x.dtype == torch.float32 else x.to(torch.float32)
        if xf.numel() == 0:
            lo = hi = 0.0
        else:
            lo_t, hi_t = torch.aminmax(xf)
            lo, hi = float(lo_t), float(hi_t)
        scale, zp = dynamic_quantize_params(lo, hi)
        tmp, whole = _scratch(xf.numel())
        tmp, whole = tmp.view(xf.shape), whole.view(xf.shape)
        torch.div(xf, float(scale), out=tmp)
        tmp.round_().add_(zp).clamp_(0, 255)
        whole.copy_(tmp)                           # exact: integers in [0, 255]
        y = torch.empty(xf.shape, dtype=torch.uint8)
        y.copy_(whole)
        return (y, torch.tensor(float(scale), dtype=torch.float32).to(x.dtype),
                torch.tensor(int(zp), dtype=torch.uint8))
    return dynamic_quantize


# ----------------------------------------------------------------------------- QLinearMatMul / QLinearConv
def _requantize(acc, factor, yzp, dt: DType, out: torch.dtype):
    r = acc.to(torch.float64) * factor.to(torch.float64)
    if yzp is not None:
        r = r + yzp.to(torch.float64)
    return saturate_int(torch.round(r), dt, out)


def _out_int_type(ctx: NodeContext, zp_index: int, fallback_index: int):
    dt = ctx.dtype(zp_index) if ctx.has_input(zp_index) else ctx.dtype(fallback_index)
    if dt not in (DType.INT8, DType.UINT8):
        raise ctx.unsupported(f"quantized type {dt.name if dt is not None else '?'} (int8 / uint8 only)")
    return dt


@register("QLinearMatMul", since=10, fusion=FusionKind.OUT_FUSABLE,
          infer=lambda ctx: [(ctx.dtype(7) or None, matmul_shape(ctx.shape(0), ctx.shape(3)))])
def _qlinear_matmul(ctx: NodeContext):
    for i in (0, 3):
        if ctx.dtype(i) and ctx.dtype(i) not in (DType.INT8, DType.UINT8):
            raise ctx.unsupported(f"input type {ctx.dtype(i).name} (int8 / uint8 only)")
    dt = _out_int_type(ctx, 7, 0)
    out = dt.to_torch()

    def qlinear_matmul(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp):
        acc = int_matmul(a, b, a_zp, b_zp)
        a_s = a_s.reshape(()) if a_s.numel() == 1 else a_s.unsqueeze(-1)
        b_s = b_s.reshape(()) if b_s.numel() == 1 else b_s
        return _requantize(acc, a_s * b_s / y_s.reshape(()), y_zp.reshape(()), dt, out)
    return qlinear_matmul


@register("QLinearConv", since=10, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True)
def _qlinear_conv(ctx: NodeContext):
    check_rank(ctx)
    geo = ConvGeometry(ctx)
    dt = _out_int_type(ctx, 7, 0)
    out = dt.to_torch()

    def qlinear_conv(x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp=None, b=None):
        acc = int_conv(x, w, x_zp, w_zp, geo).to(torch.float64)
        lead = (1, -1) + (1,) * (x.dim() - 2)
        if b is not None:
            acc = acc + b.to(torch.float64).reshape(lead)
        w_s = w_s.reshape(()) if w_s.numel() == 1 else w_s.reshape(lead)
        factor = x_s.reshape(()) * w_s / y_s.reshape(())
        return _requantize(acc, factor, None if y_zp is None else y_zp.reshape(()), dt, out)
    return qlinear_conv
