"""Fused ops of modern decoder blocks (Llama, Qwen2, Mistral, T5) in domain ``fusegraph``
(version 1), made by the decoder fusion rules (``passes/fusion/rules_decoder.py``); no
frontend creates them.

- ``RMSNorm(x, gamma?)``: ``x / sqrt(mean(x^2 over the last axis) + epsilon) [* gamma]``,
  computed in float32 (as the exporters' float32 upcast does) and rounded once to
  ``out_dtype`` when given (a Cast folded in, ``passes/fold_casts.py``), else to x's type.
  The op's own kernel is the float32 composition the graph held (square, mean, add, square
  root, reciprocal, products), so a row whose float32 sum of squares overflows gives what
  the graph gives (0, or NaN where x is infinite), and a NaN makes its whole row NaN.
- ``SkipRMSNorm(a, b, gamma?)``: ``s = a + b``; outputs ``RMSNorm(s)`` and, when the node has a
  second output, ``s`` itself (the residual stream of pre-norm decoders).
- ``RotaryEmbedding(x, cos, sin)``: rotary position embedding in the rotate-half form
  ``x * cos + cat(-x2, x1) * sin`` (``x1`` / ``x2`` the first and second half of the last
  axis); ``cos`` / ``sin`` broadcast into x's ``[..., S, D]`` without enlarging it. With
  ``heads`` > 0, x comes as ``[B, S, H*D]`` (a projection before its head split) and the
  rotation is that of its ``[B, H, S, D]`` heads (cos / sin given as they broadcast into the
  heads), written back in x's own ``[B, S, H*D]`` layout. Constants stay float32; a reduced x
  is rotated in float32 and rounded once.
- ``GatedActivation(x)``: ``act(x[..., :N]) * x[..., N:]`` with ``N`` half the last axis (the
  gate and the up projection of a gated MLP packed into one product, SwiGLU / GeGLU);
  ``activation`` one of ``ACTIVATIONS``. A reduced x is computed in float32, rounded once.
- ``GatedLinear(x, w_gate, w_up, b_gate?, b_up?)``: ``act(x @ w_gate^T + b_gate) * (x @ w_up^T +
  b_up)``, the weights ``[N, K]``: a gated MLP's two products and its gating in one node, so a
  kernel can run the activation and the multiplication in its products' epilogues instead of
  a pass over a packed product's result. Reduced operands: both products accumulated in
  float32, unrounded, the gating in float32, the result rounded once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir.shape import broadcast_shapes
from .activations import gelu as _gelu_fn
from .common import out_dtype_attr, product_out_dtype
from .registry import FusionKind, NodeContext, Precision, register

DOMAIN = "fusegraph"
REDUCED = (torch.bfloat16, torch.float16)


def _out_type(ctx: NodeContext) -> torch.dtype | None:
    given = out_dtype_attr(ctx)
    return None if given is None else given.to_torch()


# ---------------------------------------------------------------- RMSNorm / SkipRMSNorm

def rms_norm_float32(x: torch.Tensor, gamma: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The graph's float32 arithmetic: ``x * (1 / sqrt(mean(x * x) + eps)) [* gamma]``."""
    xs = x.float()
    r = torch.mean(xs * xs, dim=-1, keepdim=True).add_(eps).sqrt_().reciprocal_()
    y = xs * r
    return y if gamma is None else y.mul_(gamma.float())


def _rms_infer(ctx: NodeContext):
    return [(product_out_dtype(ctx), ctx.shape(0))]


@register("RMSNorm", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_rms_infer,
          layout_sensitive=True, writes_out=True,
          precision=(Precision.KEEP, "normalisation statistics (mean square): float32"))
def _rms_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon"))
    dtype = _out_type(ctx)

    def rms_norm(x, gamma=None, out=None):
        y = rms_norm_float32(x, gamma, eps)
        want = dtype or x.dtype
        if out is not None:
            return out.copy_(y)
        return y if y.dtype == want else y.to(want)
    return rms_norm


def _skip_rms_infer(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    shape = broadcast_shapes(a, b) if a is not None and b is not None else None
    return [(product_out_dtype(ctx), shape), (ctx.dtype(0) or None, shape)][:ctx.n_outputs]


@register("SkipRMSNorm", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_skip_rms_infer,
          layout_sensitive=True,
          precision=(Precision.KEEP, "a residual sum and normalisation statistics: float32"))
def _skip_rms_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon"))
    dtype = _out_type(ctx)
    both = ctx.n_outputs == 2

    def skip_rms_norm(a, b, gamma=None):
        s = torch.add(a, b)
        y = rms_norm_float32(s, gamma, eps)
        y = y.to(dtype or s.dtype)
        return (y, s) if both else y
    return skip_rms_norm


# ---------------------------------------------------------------- RotaryEmbedding

def rotary_views(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int):
    """(x as ``[..., S, D]`` heads, cos, sin) for ``heads`` (0: x as it is); a RuntimeError when
    cos / sin do not broadcast into the heads without enlarging them (the fused node's output
    has x's shape: a larger broadcast is the graph's, not this op's)."""
    if heads:
        b, s, hd = x.shape
        x = x.view(b, s, heads, hd // heads).transpose(1, 2)
    for t in (cos, sin):
        if t.dim() > x.dim() or any(d not in (1, n) for d, n in zip(t.shape[::-1], x.shape[::-1])):
            raise RuntimeError(f"rotary embedding: a cos / sin table of shape {tuple(t.shape)} does not broadcast "
                               f"into the rotated heads {tuple(x.shape)}")
    return x, cos, sin


def rotate_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = x * cos + cat(-x2, x1) * sin`` (``out`` of x's shape, any strides, not x), in
    three passes and no temporary: ``x * cos``, then each half's ``addcmul`` (a fused
    multiply-add where ATen vectorises it: the graph's separate product and sum round twice,
    this once, so results may differ in the last bit, and a product beyond float32's range
    that the sum would bring back is not infinite here)."""
    h = x.shape[-1] // 2
    torch.mul(x, cos, out=out)
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1.0)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])
    return out


def _rotary_infer(ctx: NodeContext):
    return [(ctx.dtype(0) or None, ctx.shape(0))]


@register("RotaryEmbedding", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_rotary_infer,
          writes_out=True,
          precision=(Precision.FOLLOW, "a rotation by float32 cos / sin tables: float32 inside, rounded once"))
def _rotary(ctx: NodeContext):
    heads = int(ctx.attr("heads", 0))
    if heads < 0:
        raise ctx.unsupported(f"heads={heads}")

    def rotary(x, cos, sin, out=None):
        if x.shape[-1] % (2 * max(heads, 1)):
            raise RuntimeError(f"rotary embedding: the last axis {x.shape[-1]} does not split into "
                               f"{max(heads, 1)} heads of an even size")
        dst = torch.empty(x.shape, dtype=x.dtype) if out is None else out
        xv, c, s = rotary_views(x, cos, sin, heads)
        if x.dtype in REDUCED:           # float32 inside, one rounding
            y = rotate_into(xv.float(), c.float(), s.float(), torch.empty(xv.shape))
            rotary_views(dst, cos, sin, heads)[0].copy_(y)
        else:
            rotate_into(xv, c.to(x.dtype), s.to(x.dtype), rotary_views(dst, cos, sin, heads)[0])
        return dst
    return rotary


# ---------------------------------------------------------------- GatedActivation

def _silu_into(a, out):
    return torch._C._nn.silu(a, out=out)


ACTIVATIONS = {
    "silu": _silu_into,
    "gelu": lambda a, out: _gelu_fn(a, "none", out),
    "gelu_tanh": lambda a, out: _gelu_fn(a, "tanh", out),
    "relu": lambda a, out: torch.clamp_min(a, 0, out=out),
    "sigmoid": lambda a, out: torch.sigmoid(a, out=out),
}


def _gated_infer(ctx: NodeContext):
    xs = ctx.shape(0)
    if xs is None or not xs:
        return [(ctx.dtype(0) or None, None)]
    n = xs[-1] // 2 if isinstance(xs[-1], int) else None
    return [(ctx.dtype(0) or None, tuple(xs[:-1]) + (n,))]


def gated_into(act, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = act(x[..., :N]) * x[..., N:]``: the gate copied into ``out`` first and the
    activation run there in place, as the CPU backend's kernel does (ATen's vectorised and
    scalar activation loops can differ in the last bit, and a strided half of short rows takes
    the scalar one)."""
    n = x.shape[-1] // 2
    out.copy_(x[..., :n])
    act(out, out)
    return out.mul_(x[..., n:])


@register("GatedActivation", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_gated_infer,
          writes_out=True,
          precision=(Precision.FOLLOW, "an activation times the up projection: float32 inside, rounded once"))
def _gated(ctx: NodeContext):
    name = ctx.attr("activation")
    if name not in ACTIVATIONS:
        raise ctx.unsupported(f"activation {name!r} (expected one of {sorted(ACTIVATIONS)})")
    act = ACTIVATIONS[name]

    def gated(x, out=None):
        if x.shape[-1] % 2:
            raise RuntimeError(f"gated activation: the last axis {x.shape[-1]} is odd")
        shape = tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
        if x.dtype in REDUCED:
            y = gated_into(act, x.float(), torch.empty(shape))
            return y.to(x.dtype) if out is None else out.copy_(y)
        return gated_into(act, x, torch.empty(shape, dtype=x.dtype) if out is None else out)
    return gated


# ---------------------------------------------------------------- GatedLinear

def _gated_linear_infer(ctx: NodeContext):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if xs is None or ws is None:
        return [(ctx.dtype(0) or None, None)]
    return [(ctx.dtype(0) or None, tuple(xs[:-1]) + (ws[0],))]


@register("GatedLinear", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_gated_linear_infer,
          writes_out=True, precision=(Precision.REDUCE, "two products and their gating: the reduced-type GEMMs "
                                      "accumulate in float32, the gating is float32, the result rounded once"))
def _gated_linear(ctx: NodeContext):
    name = ctx.attr("activation")
    if name not in ACTIVATIONS:
        raise ctx.unsupported(f"activation {name!r} (expected one of {sorted(ACTIVATIONS)})")
    gate, up = ctx.shape(1), ctx.shape(2)
    if gate is not None and (len(gate) != 2 or up != gate):
        raise ctx.unsupported(f"weights of shapes {gate} and {up} (expected two [N, K])")
    for i in (3, 4):
        if ctx.has_input(i) and gate is not None and ctx.shape(i) not in (None, (gate[0],)):
            raise ctx.unsupported(f"a bias of shape {ctx.shape(i)} (expected [{gate[0]}])")
    act = ACTIVATIONS[name]

    def gated_linear(x, w_gate, w_up, b_gate=None, b_up=None, out=None):
        if w_gate.dim() != 2 or w_gate.shape != w_up.shape or w_gate.shape[1] != x.shape[-1]:
            raise RuntimeError(f"gated linear: weights {tuple(w_gate.shape)} and {tuple(w_up.shape)} are not "
                               f"two [N, {x.shape[-1]}]")
        f = torch.float32 if x.dtype in REDUCED else x.dtype
        xf = x.to(f)
        gate = F.linear(xf, w_gate.to(f), None if b_gate is None else b_gate.to(f))
        y = act(gate, gate).mul_(F.linear(xf, w_up.to(f), None if b_up is None else b_up.to(f)))
        if out is not None:
            return out.copy_(y)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    return gated_linear
