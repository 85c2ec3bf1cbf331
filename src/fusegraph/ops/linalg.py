"""Linear algebra: Gemm, MatMul (numpy broadcasting, 1-D operands), MatMulInteger, Einsum, Det.

Float products run as ``torch.matmul`` / ``addmm``; unsigned 32/64-bit integers, which
torch's matmul lacks, go through int64 (same bits modulo 2**64). MatMulInteger sums exactly
in a float type wide enough for its reduction length.
"""
from __future__ import annotations

import torch

from ..ir.shape import broadcast_shapes
from .conv import exact_float
from .precision_reasons import MATRIX_PRODUCT
from .registry import FusionKind, NodeContext, no_out, register

_VIA_INT64 = (torch.uint16, torch.uint32, torch.uint64)


def _mm(a, b):
    if a.dtype in _VIA_INT64:
        return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.matmul(a, b)


def matmul_shape(a, b):
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        raise ValueError("MatMul operands must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    out = broadcast_shapes(a2[:-2], b2[:-2])
    if out is None:
        return None
    out = tuple(out)
    if len(a) > 1:
        out += (a2[-2],)
    if len(b) > 1:
        out += (b2[-1],)
    return out


# ----------------------------------------------------------------------------- Gemm
def _gemm_infer(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    ta, tb = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    shape = None
    if a is not None and b is not None:
        shape = (a[1 if ta else 0], b[0 if tb else 1])
    return [(ctx.dtype(0) or None, shape)]


@register("Gemm", since=7, fusion=FusionKind.OUT_FUSABLE, infer=_gemm_infer, writes_out=True,
          precision=MATRIX_PRODUCT)
def _gemm(ctx: NodeContext):
    ta, tb = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    is_float = ctx.dtype(0).is_float if ctx.dtype(0) else True
    has_c = ctx.has_input(2) and beta != 0
    if ctx.dtype(0) and is_float and has_c:       # out form of the addmm path below
        def gemm_addmm(a, b, c, out=None):
            return torch.addmm(c.to(a.dtype), a.t() if ta else a, b.t() if tb else b,
                               beta=beta, alpha=alpha, out=out)
        return gemm_addmm
    if ctx.dtype(0) and is_float and not has_c and alpha == 1.0:
        def gemm_mm(a, b, c=None, out=None):
            return torch.matmul(a.t() if ta else a, b.t() if tb else b, out=out)
        return gemm_mm

    def gemm(a, b, c=None):
        if ta:
            a = a.t()
        if tb:
            b = b.t()
        if is_float and c is not None and beta != 0:
            return torch.addmm(c.to(a.dtype), a, b, beta=beta, alpha=alpha)
        y = _mm(a, b)
        if alpha != 1.0:
            y = (y * alpha).to(y.dtype)
        if c is not None and beta != 0:
            y = (y + (c * beta if beta != 1.0 else c)).to(y.dtype)
        return y
    return no_out(gemm)


# ----------------------------------------------------------------------------- MatMul
def _matmul_infer(ctx: NodeContext):
    return [(ctx.dtype(0) or None, matmul_shape(ctx.shape(0), ctx.shape(1)))]


@register("MatMul", since=1, fusion=FusionKind.OUT_FUSABLE, infer=_matmul_infer, writes_out=True,
          precision=MATRIX_PRODUCT)
def _matmul(ctx: NodeContext):
    tdt = ctx.dtype(0)
    if tdt and tdt.to_torch() not in _VIA_INT64:
        return _matmul_out
    return no_out(_mm)


def _matmul_out(a, b, out=None):
    """``torch.matmul``; a 1-D left operand writes through a [1, N] view of ``out`` (torch
    would otherwise resize the caller's buffer, which it deprecates)."""
    if out is None:
        return torch.matmul(a, b)
    if a.dim() == 1 and b.dim() == 2:
        torch.mm(a.unsqueeze(0), b, out=out.unsqueeze(0))
        return out
    return torch.matmul(a, b, out=out)


# ----------------------------------------------------------------------------- MatMulInteger
def _row_zero_point(zp):
    """a_zero_point: scalar, one per row (M,) of a 2-D A, or N-D (..., M, 1)."""
    if zp.numel() == 1:
        return zp.reshape(())
    return zp.unsqueeze(-1) if zp.dim() == 1 else zp


def _col_zero_point(zp):
    """b_zero_point: scalar, one per column (N,), or N-D (..., 1, N)."""
    return zp.reshape(()) if zp.numel() == 1 else zp


def int_matmul(a, b, azp, bzp):
    """``(a - azp) @ (b - bzp)`` exactly, as a float tensor."""
    ft = exact_float(a.shape[-1], a.device)
    af, bf = a.to(ft), b.to(ft)
    if azp is not None:
        af = af - _row_zero_point(azp).to(ft)
    if bzp is not None:
        bf = bf - _col_zero_point(bzp).to(ft)
    return torch.matmul(af, bf)


def _mmi_infer(ctx: NodeContext):
    from ..ir import DType
    return [(DType.INT32, matmul_shape(ctx.shape(0), ctx.shape(1)))]


@register("MatMulInteger", since=10, fusion=FusionKind.OUT_FUSABLE, infer=_mmi_infer)
def _matmul_integer(ctx: NodeContext):
    def matmul_integer(a, b, azp=None, bzp=None):
        return int_matmul(a, b, azp, bzp).to(torch.int32)
    return matmul_integer


# ----------------------------------------------------------------------------- Einsum
@register("Einsum", since=12, fusion=FusionKind.OPAQUE)
def _einsum(ctx: NodeContext):
    eq = "".join(str(ctx.attr("equation")).split())

    def einsum(*xs):
        if xs and xs[0].dtype in _VIA_INT64:
            return torch.einsum(eq, *(x.to(torch.int64) for x in xs)).to(xs[0].dtype)
        return torch.einsum(eq, *xs)
    return einsum


# ----------------------------------------------------------------------------- Det
def _det_infer(ctx: NodeContext):
    s = ctx.shape(0)
    return [(ctx.dtype(0) or None, None if s is None else tuple(s[:-2]))]


@register("Det", since=11, fusion=FusionKind.OPAQUE, infer=_det_infer)
def _det(ctx: NodeContext):
    def det(x):
        if x.dtype in (torch.float16, torch.bfloat16):
            return torch.linalg.det(x.float()).to(x.dtype)
        return torch.linalg.det(x)
    return det
