"""Logic, comparison and bit ops: And, Or, Xor, Not, Equal, Less, Greater, LessOrEqual,
GreaterOrEqual, BitShift, BitwiseAnd/Or/Xor/Not, Where, IsNaN, IsInf.

Comparisons return bool; uint16/32/64 go through the unsigned emulation of
``elementwise.py``, since torch orders and shifts few unsigned types itself. Logic,
comparison, bitwise and Where kernels on native dtypes accept ``out=`` (``writes_out``).
"""
from __future__ import annotations

import torch

from ..ir import DType
from .common import broadcast_of_inputs, same_as_input
from .elementwise import EMULATED, SIGNED_VIEW, UNSIGNED, ordered, torch_dtype
from .precision_reasons import ELEMENTWISE
from .registry import FusionKind, NodeContext, no_out, register
from .value_range import FactLaw, union

_BOOL_BCAST = broadcast_of_inputs(DType.BOOL)
_BCAST = broadcast_of_inputs()
_BC = FusionKind.BROADCAST
_EW = FusionKind.ELEMENTWISE


def _no_strings(ctx: NodeContext) -> None:
    for i in range(ctx.n_inputs):
        if ctx.dtype(i) == DType.STRING:
            raise ctx.unsupported("string tensors cannot be held by torch")


# --- boolean logic -----------------------------------------------------------------------

for _op, _fn in {"And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor}.items():
    register(_op, since=1, fusion=_BC, infer=_BOOL_BCAST, writes_out=True)(lambda ctx, _fn=_fn: _fn)

register("Not", since=1, fusion=_EW, infer=same_as_input(0), writes_out=True)(lambda ctx: torch.logical_not)


# --- comparisons -------------------------------------------------------------------------

@register("Equal", since=1, fusion=_BC, infer=_BOOL_BCAST, writes_out=True)
def _equal(ctx: NodeContext):
    _no_strings(ctx)
    tdt = torch_dtype(ctx, 0)
    if tdt in EMULATED:                # equality of bits: the signed view is exact
        s = SIGNED_VIEW[tdt]
        return no_out(lambda a, b: torch.eq(a.view(s), b.view(s)))
    return torch.eq


def _compare(op_type: str, since: int, fn):
    @register(op_type, since=since, fusion=_BC, infer=_BOOL_BCAST, writes_out=True)
    def build(ctx: NodeContext, _fn=fn):
        _no_strings(ctx)
        tdt = torch_dtype(ctx, 0)
        return no_out(ordered(_fn, tdt)) if tdt in EMULATED else _fn
    return build


_compare("Less", 1, torch.lt)
_compare("Greater", 1, torch.gt)
_compare("LessOrEqual", 12, torch.le)
_compare("GreaterOrEqual", 12, torch.ge)


# --- bitwise -----------------------------------------------------------------------------

def _on_signed_view(fn, tdt):
    """Bit ops act on bits alone: run uint16/32/64 on the same-width signed view."""
    if tdt in EMULATED:
        s = SIGNED_VIEW[tdt]
        return no_out(lambda *xs: fn(*[x.view(s) for x in xs]).view(tdt))
    return fn


for _op, _fn in {"BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
                 "BitwiseXor": torch.bitwise_xor}.items():
    register(_op, since=18, fusion=_BC, infer=_BCAST, writes_out=True)(
        lambda ctx, _fn=_fn: _on_signed_view(_fn, torch_dtype(ctx, 0)))

register("BitwiseNot", since=18, fusion=_EW, infer=same_as_input(0), writes_out=True)(
    lambda ctx: _on_signed_view(torch.bitwise_not, torch_dtype(ctx, 0)))


@register("BitShift", since=11, fusion=_BC, infer=_BCAST)
def _bitshift(ctx: NodeContext):
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.unsupported(f"direction must be LEFT or RIGHT, got {direction!r}")
    tdt = torch_dtype(ctx, 0)
    if tdt is None or tdt.is_floating_point or tdt == torch.bool:
        raise ctx.unsupported(f"input type {ctx.dtype(0).name} is not an integer type")
    bits = torch.iinfo(tdt).bits
    unsigned = tdt in UNSIGNED
    sdt = SIGNED_VIEW.get(tdt, tdt)
    smax = torch.iinfo(sdt).max

    # Shifts by a negative amount or by >= bits give only the sign fill; on the signed view an
    # unsigned amount >= 2**(bits-1) reads negative, which is out of range as well.
    def left(x, y):
        xs, ys = x.view(sdt), y.view(sdt)
        oor = (ys < 0) | (ys >= bits)
        r = torch.bitwise_left_shift(xs, ys.clamp(0, bits - 1))
        return torch.where(oor, torch.zeros_like(r), r).view(tdt)

    def right_signed(x, y):
        oor = (y < 0) | (y >= bits)
        return torch.bitwise_right_shift(x, torch.where(oor, torch.full_like(y, bits - 1), y))

    def right_unsigned(x, y):
        xs, ys = x.view(sdt), y.view(sdt)
        oor = (ys < 0) | (ys >= bits)
        yc = ys.clamp(0, bits - 1)
        logical = torch.bitwise_right_shift(torch.bitwise_and(torch.bitwise_right_shift(xs, 1), smax),
                                            (yc - 1).clamp_min(0))   # top bit cleared: logical
        r = torch.where(yc == 0, xs, logical)
        return torch.where(oor, torch.zeros_like(r), r).view(tdt)

    if direction == "LEFT":
        return left
    return right_unsigned if unsigned else right_signed


# --- selection and classification --------------------------------------------------------

@register("Where", since=9, fusion=_BC, infer=broadcast_of_inputs(dtype_from=1), writes_out=True,
          precision=ELEMENTWISE, value_range=FactLaw("one of the two branches", lambda cond, a, b: union(a, b)))
def _where(ctx: NodeContext):
    _no_strings(ctx)
    tdt = torch_dtype(ctx, 1)
    if tdt in EMULATED:                # selection moves bits only: use the signed view
        s = SIGNED_VIEW[tdt]
        return no_out(lambda c, x, y: torch.where(c, x.view(s), y.view(s)).view(tdt))
    return torch.where


_F8 = {torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz}


@register("IsNaN", since=9, fusion=_EW, infer=lambda ctx: [(DType.BOOL, ctx.shape(0))])
def _isnan(ctx: NodeContext):
    if torch_dtype(ctx, 0) in _F8:
        return lambda x: torch.isnan(x.float())
    return torch.isnan


@register("IsInf", since=10, fusion=_EW, infer=lambda ctx: [(DType.BOOL, ctx.shape(0))])
def _isinf(ctx: NodeContext):
    neg = bool(ctx.attr("detect_negative", 1))
    pos = bool(ctx.attr("detect_positive", 1))
    up = (lambda x: x.float()) if torch_dtype(ctx, 0) in _F8 else (lambda x: x)
    if neg and pos:
        return lambda x: torch.isinf(up(x))
    if pos:
        return lambda x: torch.isposinf(up(x))
    if neg:
        return lambda x: torch.isneginf(up(x))
    return lambda x: torch.zeros(x.shape, dtype=torch.bool, device=x.device)
