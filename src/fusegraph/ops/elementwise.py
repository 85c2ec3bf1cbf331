"""Elementwise and broadcast arithmetic: Add, Sub, Mul, Div, Pow, Mod, the variadic Min, Max,
Sum, Mean, and the unary math ops (Abs ... Atanh, Erf, Round, Sign).

Each kernel is a torch call; attributes and dtypes are read once at build time. torch
implements little arithmetic for uint16/32/64, so those dtypes are emulated here: add, sub
and mul on the same-width signed view (two's complement wraps alike), ordered ops on a wider
signed type (uint16, uint32) or, for uint64, on keys with the sign bit flipped; uint64
division is done with signed 64-bit ops. The helpers are shared with ``logical.py``.

Kernels on dtypes torch handles natively accept ``out=`` (``writes_out``); the emulated
unsigned paths are marked ``no_out``.
"""
from __future__ import annotations

import torch

from .common import broadcast_of_inputs, same_as_input
from .precision_reasons import ACTIVATION, ELEMENTWISE
from .registry import FusionKind, NodeContext, Precision, no_out, register
from .value_range import PRODUCT, SAME_AS_INPUT, SUM, UNION, UNIT_BOUNDED

_BCAST = broadcast_of_inputs()
_SAME = same_as_input(0)
_EXP_LOG = (Precision.KEEP, "exp / log / pow / sqrt: float32")

# --- unsigned emulation ------------------------------------------------------------------

UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
EMULATED = (torch.uint16, torch.uint32, torch.uint64)   # dtypes torch has little arithmetic for
SIGNED_VIEW = {torch.uint8: torch.int8, torch.uint16: torch.int16, torch.uint32: torch.int32,
               torch.uint64: torch.int64}
_WIDE = {torch.uint16: torch.int32, torch.uint32: torch.int64}
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def torch_dtype(ctx: NodeContext, i: int) -> torch.dtype | None:
    """Input ``i``'s torch dtype, or None when unknown or not a torch type."""
    try:
        return ctx.dtype(i).to_torch()
    except TypeError:
        return None


def u64_key(t: torch.Tensor) -> torch.Tensor:
    """uint64 bits -> int64 with the same order (sign bit flipped)."""
    return torch.bitwise_xor(t.view(torch.int64), _I64_MIN)


def u64_unkey(k: torch.Tensor) -> torch.Tensor:
    return torch.bitwise_xor(k, _I64_MIN).view(torch.uint64)


def ordered(fn, tdt: torch.dtype | None):
    """Wrap an order-based op (compare, min, max, clamp; div and mod for uint16/32) so it runs on
    emulated unsigned types.

    Tensor arguments of dtype ``tdt`` are widened (uint16/32) or keyed (uint64); an integer
    result goes back to ``tdt``, a bool result is returned as is.
    """
    if tdt in _WIDE:
        wide = _WIDE[tdt]

        def k(*xs):
            r = fn(*[x.to(wide) if isinstance(x, torch.Tensor) and x.dtype == tdt else x for x in xs])
            return r.to(tdt) if r.dtype == wide else r
        return k
    if tdt == torch.uint64:
        def k64(*xs):
            r = fn(*[u64_key(x) if isinstance(x, torch.Tensor) and x.dtype == tdt else x for x in xs])
            return u64_unkey(r) if r.dtype == torch.int64 else r
        return k64
    return fn


def u64_scalar_key(v: int) -> int:
    """A Python uint64 value mapped to the key space of ``u64_key``."""
    return int(v) - (1 << 63)


def wrapping(fn, tdt: torch.dtype | None):
    """Add/sub-like ops that wrap modulo 2**bits: run on the same-width signed view."""
    if tdt in EMULATED:
        s = SIGNED_VIEW[tdt]
        return lambda *xs: fn(*[x.view(s) for x in xs]).view(tdt)
    return fn


def _udiv64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Unsigned 64-bit truncating division on int64 views (Hacker's Delight 9-3)."""
    big = b < 0                                            # divisor >= 2**63: quotient 0 or 1
    bs = torch.where(big, torch.ones_like(b), b)
    half = torch.bitwise_and(torch.bitwise_right_shift(a, 1), _I64_MAX)   # a >>> 1
    q = torch.div(half, bs, rounding_mode="trunc") * 2
    r = a - q * bs                                         # in [0, 2 b): compare unsigned
    q = q + (torch.bitwise_xor(r, _I64_MIN) >= torch.bitwise_xor(bs, _I64_MIN)).to(torch.int64)
    q_big = (torch.bitwise_xor(a, _I64_MIN) >= torch.bitwise_xor(b, _I64_MIN)).to(torch.int64)
    return torch.where(big, q_big, q)


# --- binary arithmetic -------------------------------------------------------------------

def copy_out(x, out=None):
    """A copy of ``x`` (into ``out`` when given)."""
    return x.clone() if out is None else out.copy_(x)


def _binary(op_type: str, fn, value_range):
    @register(op_type, since=7, fusion=FusionKind.BROADCAST, infer=_BCAST, writes_out=True, precision=ELEMENTWISE,
              value_range=value_range)
    def build(ctx: NodeContext, _fn=fn):
        tdt = torch_dtype(ctx, 0)
        return no_out(wrapping(_fn, tdt)) if tdt in EMULATED else _fn
    return build


_binary("Add", torch.add, SUM)
_binary("Sub", torch.sub, SUM)
_binary("Mul", torch.mul, PRODUCT)


def _trunc_div(a, b, out=None):
    return torch.div(a, b, rounding_mode="trunc", out=out)


@register("Div", since=7, fusion=FusionKind.BROADCAST, infer=_BCAST, writes_out=True, precision=ELEMENTWISE)
def _div(ctx: NodeContext):
    tdt = torch_dtype(ctx, 0)
    if tdt == torch.uint64:
        return no_out(lambda a, b: _udiv64(a.view(torch.int64), b.view(torch.int64)).view(torch.uint64))
    if ctx.dtype(0).is_integer:
        if tdt in EMULATED:                  # uint16/32: exact on the wider signed type
            return no_out(ordered(_trunc_div, tdt))
        return _trunc_div
    if tdt is None:                          # type unknown at build time
        return no_out(lambda a, b: torch.div(a, b) if a.is_floating_point() else _trunc_div(a, b))
    return torch.div


@register("Mod", since=10, fusion=FusionKind.BROADCAST, infer=_BCAST)
def _mod(ctx: NodeContext):
    fmod = int(ctx.attr("fmod", 0))
    if fmod not in (0, 1):
        raise ctx.unsupported(f"fmod must be 0 or 1, got {fmod}")
    tdt = torch_dtype(ctx, 0)
    if tdt == torch.uint64:          # both roundings agree on non-negative operands
        def umod(a, b):
            a, b = a.view(torch.int64), b.view(torch.int64)
            return (a - _udiv64(a, b) * b).view(torch.uint64)
        return umod
    fn = torch.fmod if fmod else torch.remainder
    return ordered(fn, tdt)


def _exponent(et: torch.dtype | None):
    """Exponent preparation: torch has no pow over uint16/32/64."""
    if et in _WIDE:
        return lambda b: b.to(torch.int64)
    if et == torch.uint64:
        return lambda b: b.view(torch.int64)
    return lambda b: b


@register("Pow", since=7, fusion=FusionKind.BROADCAST, infer=_BCAST, precision=_EXP_LOG)
def _pow(ctx: NodeContext):
    bt, et = torch_dtype(ctx, 0), torch_dtype(ctx, 1)
    prep = _exponent(et)
    if bt is not None and not bt.is_floating_point and et is not None and et.is_floating_point:
        # integer base, float exponent: computed in double and truncated, as numpy does
        return lambda a, b: torch.pow(a.double(), b.double()).to(a.dtype)

    def k(a, b):
        r = torch.pow(a, prep(b))
        return r if r.dtype == a.dtype else r.to(a.dtype)
    return k


# --- variadic ----------------------------------------------------------------------------

def _pairwise(op_type: str, since: int, pair_of, finish=None, **facts):
    """Register a variadic op that folds a binary op over its inputs (with broadcasting).

    With ``out=``, only the last step writes ``out``: every input has been read by then, so
    ``out`` may be the buffer of any input of its shape."""
    @register(op_type, since=since, fusion=FusionKind.BROADCAST, infer=_BCAST, writes_out=True, **facts)
    def build(ctx: NodeContext):
        n = ctx.n_inputs
        if n < 1:
            raise ctx.unsupported("needs at least one input")
        tdt = torch_dtype(ctx, 0)
        pair = pair_of(tdt)
        if n == 1:
            return copy_out      # finish(x, 1) is x for Mean

        def k(*xs, out=None):
            acc = xs[0]
            for x in xs[1:-1]:
                acc = pair(acc, x)
            acc = pair(acc, xs[-1], out=out)
            return acc if finish is None else finish(acc, n)
        if tdt in EMULATED:
            def k_emulated(*xs):
                acc = pair(xs[0], xs[1])
                for x in xs[2:]:
                    acc = pair(acc, x)
                return acc if finish is None else finish(acc, n)
            return no_out(k_emulated)
        return k
    return build


_pairwise("Max", 8, lambda t: ordered(torch.maximum, t), precision=ELEMENTWISE, value_range=UNION)
_pairwise("Min", 8, lambda t: ordered(torch.minimum, t), precision=ELEMENTWISE, value_range=UNION)
_pairwise("Sum", 8, lambda t: wrapping(torch.add, t), value_range=SUM)
_pairwise("Mean", 8, lambda t: torch.add, finish=lambda acc, n: acc.div_(n) if n != 1 else acc)


# --- unary math --------------------------------------------------------------------------

_UNARY = {
    "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal,
    "Floor": torch.floor, "Ceil": torch.ceil, "Erf": torch.erf, "Round": torch.round,
    "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos,
    "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh,
    "Acosh": torch.acosh, "Atanh": torch.atanh,
}
_SINCE = {"Round": 11, "Erf": 9, "Sinh": 9, "Cosh": 9, "Asinh": 9, "Acosh": 9, "Atanh": 9}
_UNARY_FACTS = {"Exp": {"precision": _EXP_LOG}, "Log": {"precision": _EXP_LOG}, "Sqrt": {"precision": _EXP_LOG},
                "Reciprocal": {"precision": _EXP_LOG}, "Erf": {"precision": ACTIVATION, "value_range": UNIT_BOUNDED}}

for _op, _fn in _UNARY.items():
    register(_op, since=_SINCE.get(_op, 1), fusion=FusionKind.ELEMENTWISE, infer=_SAME,
             writes_out=True, **_UNARY_FACTS.get(_op, {}))(lambda ctx, _fn=_fn: _fn)


@register("Abs", since=1, fusion=FusionKind.ELEMENTWISE, infer=_SAME, writes_out=True, precision=ELEMENTWISE,
          value_range=SAME_AS_INPUT)
def _abs(ctx: NodeContext):
    if torch_dtype(ctx, 0) in UNSIGNED:
        return copy_out
    return torch.abs


@register("Neg", since=1, fusion=FusionKind.ELEMENTWISE, infer=_SAME, writes_out=True, precision=ELEMENTWISE,
          value_range=SAME_AS_INPUT)
def _neg(ctx: NodeContext):
    tdt = torch_dtype(ctx, 0)
    return no_out(wrapping(torch.neg, tdt)) if tdt in EMULATED else torch.neg


@register("Sign", since=9, fusion=FusionKind.ELEMENTWISE, infer=_SAME, writes_out=True)
def _sign(ctx: NodeContext):
    tdt = torch_dtype(ctx, 0)
    if tdt in UNSIGNED:
        s = SIGNED_VIEW[tdt]
        return no_out(lambda x: x.view(s).ne(0).to(s).view(tdt))
    return torch.sign
