"""Type conversion: Cast, CastLike (``saturate`` for float8, ``round_mode`` for float8e8m0) and
BitCast.

Conversions are torch ``.to`` calls (``copy_`` into a planned output, the same conversion), with
ONNX's float8 rules added where torch differs:
saturation clamps to the type's largest finite value first, and a non-saturating cast to
float8e4m3fn turns overflow into NaN (torch saturates that type). Types torch cannot hold
(strings, 4-bit and 2-bit types, float4) are refused at build time.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .registry import FusionKind, Movement, NodeContext, no_out, register

_FLOAT8 = {DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2, DType.FLOAT8E5M2FNUZ}
_WIDE_FLOATS = {DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16}
_E4M3FN_OVERFLOW = 464.0   # |x| above this rounds past 448, the largest finite e4m3fn


def _torch_type(ctx: NodeContext, dt: DType, what: str) -> torch.dtype:
    if dt == DType.STRING:
        raise ctx.unsupported(f"{what} type STRING: torch cannot hold strings")
    try:
        return dt.to_torch()
    except TypeError:
        raise ctx.unsupported(f"{what} type {dt.name}: torch has no such dtype") from None


_T_WIDE_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _as_float(src: DType):
    """Bring any source to a float type that ``clamp`` and comparisons accept, exactly."""
    if src == DType.UNDEFINED:        # unknown until run time
        return lambda x: x if x.dtype in _T_WIDE_FLOATS else x.double()
    if src in _WIDE_FLOATS:
        return lambda x: x
    if src in _FLOAT8 or src == DType.BOOL or src.itemsize <= 2:
        return lambda x: x.float()
    return lambda x: x.double()


def _to_float8(src: DType, dst: DType, tdst: torch.dtype, saturate: bool):
    prep = _as_float(src)
    if saturate:
        mx = float(torch.finfo(tdst).max)
        return lambda x: torch.clamp(prep(x), -mx, mx).to(tdst)
    if dst == DType.FLOAT8E4M3FN:
        def k(x):
            f = prep(x)
            return torch.where(f.abs() > _E4M3FN_OVERFLOW, float("nan"), f).to(tdst)
        return k
    return lambda x: prep(x).to(tdst)       # torch already gives inf (e5m2) or NaN (fnuz)


def _to_e8m0(tdst: torch.dtype, saturate: bool, round_mode: str):
    """float -> float8e8m0 by exponent arithmetic on float32 bits (as onnx.numpy_helper)."""
    def k(x):
        bits = x.float().view(torch.int32)
        exp = torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 0xFF)
        special = exp == 0xFF
        if round_mode == "nearest":
            g = torch.bitwise_and(bits, 0x400000) != 0
            rest = torch.bitwise_and(bits, 0x3FFFFF) != 0
            up = g & (rest | (exp > 0))
        elif round_mode == "up":
            up = torch.bitwise_and(bits, 0x7FFFFF) != 0
        else:
            up = torch.zeros_like(special)
        up = up & ~special
        if saturate:
            up = up & (exp != 0xFE)
        exp = torch.where(special, 0xFF, exp + up.to(torch.int32))
        return torch.bitwise_and(exp, 0xFF).to(torch.uint8).view(tdst)
    return k


def _cast(ctx: NodeContext, src: DType, dst: DType):
    if src != DType.UNDEFINED:
        _torch_type(ctx, src, "input")
    tdst = _torch_type(ctx, dst, "target")
    saturate = bool(ctx.attr("saturate", 1))
    if dst in _FLOAT8:
        return no_out(_to_float8(src, dst, tdst, saturate))
    if dst == DType.FLOAT8E8M0:
        round_mode = ctx.attr("round_mode", "up")
        if round_mode not in ("up", "down", "nearest"):
            raise ctx.unsupported(f"round_mode={round_mode!r}")
        return no_out(_to_e8m0(tdst, saturate, round_mode))

    def cast(x, out=None):      # copy_ converts as .to does (bfloat16 / float16: to nearest even)
        if out is not None:
            return out.copy_(x)
        return x.clone() if src == dst else x.to(tdst)
    return cast


def _to_attr(ctx: NodeContext) -> DType:
    to = ctx.attr("to")
    try:
        return DType(int(to))
    except (ValueError, TypeError):
        raise ctx.unsupported(f"unknown target type to={to!r}") from None


@register("Cast", since=1, fusion=FusionKind.ELEMENTWISE, writes_out=True,
          infer=lambda ctx: [(_to_attr(ctx), ctx.shape(0))], movement=Movement.CAST)
def _cast_build(ctx: NodeContext):
    return _cast(ctx, ctx.dtype(0), _to_attr(ctx))


@register("CastLike", since=15, fusion=FusionKind.ELEMENTWISE,
          infer=lambda ctx: [(ctx.dtype(1) or None, ctx.shape(0))])
def _castlike_build(ctx: NodeContext):
    if ctx.dtype(1) == DType.UNDEFINED:
        raise ctx.unsupported("the target_type input has an unknown type")
    k = _cast(ctx, ctx.dtype(0), ctx.dtype(1))
    return no_out(lambda x, like: k(x))



@register("BitCast", since=26, fusion=FusionKind.ELEMENTWISE,
          infer=lambda ctx: [(_to_attr(ctx), ctx.shape(0))])
def _bitcast(ctx: NodeContext):
    src, dst = ctx.dtype(0), _to_attr(ctx)
    _torch_type(ctx, src, "input")
    tdst = _torch_type(ctx, dst, "target")
    if src.itemsize != dst.itemsize:
        raise ctx.unsupported(f"{src.name} and {dst.name} differ in bit width")
    return lambda x: x.view(tdst)
