"""Activation functions and Clip: Relu, LeakyRelu, PRelu, Elu, Selu, Celu, ThresholdedRelu,
HardSigmoid, HardSwish, Softplus, Softsign, Sigmoid, Tanh, Mish, Gelu, Swish, Shrink, Clip.

Attributes (alpha, beta, gamma, lambd, bias, approximate, Clip-6's min/max) and constant Clip
bounds are read once at build time; the kernels are plain torch calls. Relu, LeakyRelu,
Sigmoid, Tanh, Gelu, Swish (alpha 1), Softplus and Clip also write into ``out=`` (their torch
function's out form, the same kernel); composite formulas do not. ``gelu`` is torch's GELU
with gelu(+inf) = +inf, as ONNX computes it (torch's vectorised erf form gives NaN there); the
fused kernels use it too.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import same_as_input
from .elementwise import EMULATED, UNSIGNED, copy_out, ordered, torch_dtype, u64_scalar_key
from .precision_reasons import ACTIVATION, ELEMENTWISE
from .registry import FusionKind, NodeContext, no_out, register
from .value_range import SAME_AS_INPUT, UNIT_BOUNDED, Fact, leaky_relu_fact

_SAME = same_as_input(0)
_EW = FusionKind.ELEMENTWISE
_FLT_MAX = 3.4028234663852886e38


def _precise(ctx: NodeContext, fn):
    """Composite formulas on float16/bfloat16 run in float32 and round once at the end."""
    if torch_dtype(ctx, 0) in (torch.float16, torch.bfloat16):
        return lambda x, *rest: fn(x.float(), *rest).to(x.dtype)
    return fn


def _simple(op_type: str, since: int, fn, writes_out: bool = False, **facts):
    register(op_type, since=since, fusion=_EW, infer=_SAME, writes_out=writes_out, **facts)(lambda ctx, _fn=fn: _fn)


_simple("Sigmoid", 1, torch.sigmoid, writes_out=True, precision=ACTIVATION, value_range=UNIT_BOUNDED)
_simple("Tanh", 1, torch.tanh, writes_out=True, precision=ACTIVATION, value_range=UNIT_BOUNDED)
_simple("Softsign", 1, F.softsign)
_simple("Mish", 18, F.mish, precision=ACTIVATION)
_simple("HardSwish", 14, F.hardswish, precision=ACTIVATION)


def _relu_out(x, out=None):
    return torch.clamp_min(x, 0, out=out) if out is not None else torch.relu(x)  # relu is clamp_min(0)


@register("Relu", since=1, fusion=_EW, infer=_SAME, writes_out=True, precision=ELEMENTWISE, value_range=SAME_AS_INPUT)
def _relu(ctx: NodeContext):
    if torch_dtype(ctx, 0) in UNSIGNED:
        return copy_out
    return _relu_out


@register("Softplus", since=1, fusion=_EW, infer=_SAME, writes_out=True, precision=ACTIVATION)
def _softplus(ctx: NodeContext):
    # log(exp(x) + 1) without overflow for large x
    return lambda x, out=None: torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device), out=out)


def _leaky_relu_range(node, ins: list[Fact]) -> list[Fact]:
    return [leaky_relu_fact(ins[0], float(node.attrs.get("alpha", 0.01)))]


@register("LeakyRelu", since=1, fusion=_EW, infer=_SAME, writes_out=True, precision=ELEMENTWISE,
          value_range=_leaky_relu_range)
def _leaky_relu(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 0.01))
    return lambda x, out=None: torch._C._nn.leaky_relu(x, alpha, out=out) if out is not None \
        else F.leaky_relu(x, alpha)


@register("PRelu", since=1, fusion=FusionKind.BROADCAST, infer=_SAME, precision=ELEMENTWISE)
def _prelu(ctx: NodeContext):
    if torch_dtype(ctx, 0) in UNSIGNED:       # never negative
        return lambda x, slope: x.clone()
    return lambda x, slope: torch.where(x < 0, x * slope, x)


@register("Elu", since=1, fusion=_EW, infer=_SAME, precision=ACTIVATION)
def _elu(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 1.0))
    return _precise(ctx, lambda x: torch.where(x > 0, x, torch.expm1(x) * alpha))


@register("Selu", since=1, fusion=_EW, infer=_SAME, precision=ACTIVATION)
def _selu(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    return _precise(ctx, lambda x: torch.where(x > 0, x * gamma, torch.expm1(x) * (alpha * gamma)))


@register("Celu", since=12, fusion=_EW, infer=_SAME)
def _celu(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha == 0:
        raise ctx.unsupported("alpha must be non-zero")
    return _precise(ctx, lambda x: torch.where(x > 0, x, torch.expm1(x / alpha) * alpha))


@register("ThresholdedRelu", since=10, fusion=_EW, infer=_SAME)
def _thresholded_relu(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 1.0))
    return lambda x: torch.where(x > alpha, x, torch.zeros((), dtype=x.dtype, device=x.device))


@register("HardSigmoid", since=1, fusion=_EW, infer=_SAME, precision=ACTIVATION, value_range=UNIT_BOUNDED)
def _hard_sigmoid(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 0.2))
    beta = float(ctx.attr("beta", 0.5))
    return _precise(ctx, lambda x: torch.clamp(x * alpha + beta, 0.0, 1.0))


def gelu(x: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None) -> torch.Tensor:
    """GELU of ``x`` into ``out`` (which may be ``x``) or a new tensor. One max over ``x`` says
    whether a +inf (or a NaN) is there; only then the +inf positions are restored afterwards
    (on a GPU always: the max would sync with the host, which a CUDA graph cannot hold)."""
    pos = None
    if approximate == "none" and x.numel() and x.is_floating_point() and (
            x.device.type != "cpu" or not bool(x.amax() < float("inf"))):
        pos = torch.isposinf(x)
    if out is x:
        torch._C._nn.gelu_(x, approximate=approximate)
    elif out is not None:
        torch._C._nn.gelu(x, approximate=approximate, out=out)
    else:
        out = F.gelu(x, approximate=approximate)
    if pos is not None:
        out.masked_fill_(pos, float("inf"))
    return out


@register("Gelu", since=20, fusion=_EW, infer=_SAME, writes_out=True, precision=ACTIVATION)
def _gelu(ctx: NodeContext):
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approximate!r} (expected 'none' or 'tanh')")
    return lambda x, out=None: gelu(x, approximate, out)


@register("Swish", since=24, fusion=_EW, infer=_SAME, writes_out=True)
def _swish(ctx: NodeContext):
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha == 1.0:
        return lambda x, out=None: torch._C._nn.silu(x, out=out) if out is not None else F.silu(x)
    return no_out(_precise(ctx, lambda x: x * torch.sigmoid(x * alpha)))


@register("Shrink", since=9, fusion=_EW, infer=_SAME)
def _shrink(ctx: NodeContext):
    bias = float(ctx.attr("bias", 0.0))
    lambd = float(ctx.attr("lambd", 0.5))
    tdt = torch_dtype(ctx, 0)

    def shrink(x):
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero))
    if tdt is not None and not tdt.is_floating_point:
        # integer input: computed in double, then truncated back, as the reference does
        return lambda x: shrink(x.double()).to(x.dtype)
    return shrink


# --- Clip --------------------------------------------------------------------------------

def _clip_limits(node) -> list[float | None]:
    """[min, max] as numbers (-inf / +inf when absent), None for one not known before a run."""
    if node.version < 11:
        return [float(node.attrs.get("min", -_FLT_MAX)), float(node.attrs.get("max", _FLT_MAX))]
    out: list[float | None] = []
    for i, absent in ((1, -math.inf), (2, math.inf)):
        v = node.inputs[i] if len(node.inputs) > i else None
        c = None if v is None else v.const
        if v is None:
            out.append(absent)
        elif c is None or c.device.type == "meta" or c.numel() != 1:
            out.append(None)
        else:
            out.append(float(c.reshape(()).item()))
    return out


def _clip_range(node, ins: list[Fact]) -> list[Fact]:
    """min(max(x, lo), hi) is monotone in x: between the clip of x's extremes (the limits
    themselves for an infinite x). Limits known only at run time bound it by their facts."""
    x, (lo, hi) = ins[0], _clip_limits(node)
    if lo is None or hi is None:
        limits = [ins[i] for i in (1, 2) if len(node.inputs) > i and node.inputs[i] is not None]
        bound = max(f.bound for f in limits) if len(limits) == 2 else max([x.bound] + [f.bound for f in limits])
        return [Fact(bound, x.nan or any(f.nan for f in limits),
                     any(f.inf for f in limits) or (x.inf and len(limits) < 2))]
    if math.isnan(lo) or math.isnan(hi):
        return [Fact(math.inf, True, True)]
    top = math.inf if x.inf else x.bound
    bound = max(abs(min(max(-top, lo), hi)), abs(min(max(top, lo), hi)))
    return [Fact(bound, x.nan, x.inf and math.isinf(bound))]


@register("Clip", since=1, fusion=_EW, infer=_SAME, writes_out=True, precision=ELEMENTWISE, value_range=_clip_range)
def _clip6(ctx: NodeContext):
    lo = float(ctx.attr("min", -_FLT_MAX))
    hi = float(ctx.attr("max", _FLT_MAX))
    return lambda x, out=None: torch.clamp(x, lo, hi, out=out)


_RUNTIME = object()


def _clip_bound(ctx: NodeContext, i: int):
    """None (absent), a Python scalar (constant) or _RUNTIME."""
    if not ctx.has_input(i):
        return None
    c = ctx.const(i)
    if c is None:
        return _RUNTIME
    if c.numel() != 1:
        raise ctx.unsupported(f"input {i} ({'min' if i == 1 else 'max'}) must be a scalar, "
                              f"got shape {list(c.shape)}")
    v = c.reshape(()).item()
    return u64_scalar_key(v) if c.dtype == torch.uint64 else v


def _clamp(x, lo, hi):
    """min(max(x, lo), hi); each bound a scalar, a tensor or None."""
    if lo is not None:
        x = torch.clamp_min(x, lo)
    if hi is not None:
        x = torch.clamp_max(x, hi)
    return x


@register("Clip", since=11, fusion=_EW, infer=_SAME, writes_out=True, precision=ELEMENTWISE, value_range=_clip_range)
def _clip11(ctx: NodeContext):
    tdt = torch_dtype(ctx, 0)
    lo, hi = _clip_bound(ctx, 1), _clip_bound(ctx, 2)
    if lo is not _RUNTIME and hi is not _RUNTIME:
        if lo is None and hi is None:
            return lambda x, *_, out=None: copy_out(x, out)
        if tdt not in EMULATED:
            if lo is not None and hi is not None:
                return lambda x, *_, out=None: torch.clamp(x, lo, hi, out=out)
            if lo is not None:
                return lambda x, *_, out=None: torch.clamp_min(x, lo, out=out)
            return lambda x, *_, out=None: torch.clamp_max(x, hi, out=out)
        if lo is not None and hi is not None:
            fn = ordered(lambda x: torch.clamp(x, lo, hi), tdt)
        else:
            fn = ordered(lambda x: _clamp(x, lo, hi), tdt)
        return no_out(lambda x, *_: fn(x))

    def k(x, t_lo=None, t_hi=None):
        a = (None if t_lo is None else t_lo.reshape(())) if lo is _RUNTIME else lo
        b = (None if t_hi is None else t_hi.reshape(())) if hi is _RUNTIME else hi
        return _clamp(x, a, b)
    return no_out(ordered(k, tdt))
