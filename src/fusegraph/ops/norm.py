"""Normalizations: BatchNormalization (inference and training mode), InstanceNormalization,
LayerNormalization, GroupNormalization, RMSNormalization, LRN, MeanVarianceNormalization,
LpNormalization.

Statistics are computed in the ``stash_type`` precision where the op has one; the common
cases run as the fused ``torch.nn.functional`` calls (``batch_norm``, ``layer_norm``,
``group_norm``, ``instance_norm``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ir import DType
from .common import normalize_axis, same_as_input
from .pool import sum_pool
from .precision_reasons import NORMALISATION
from .registry import FusionKind, NodeContext, Precision, register
from .value_range import UNKNOWN, Fact, sum_fact


def _stash(ctx: NodeContext) -> torch.dtype:
    code = int(ctx.attr("stash_type", 1))
    try:
        dt = DType(code).to_torch()
    except (ValueError, TypeError):
        raise ctx.unsupported(f"stash_type {code}") from None
    if not dt.is_floating_point:
        raise ctx.unsupported(f"stash_type {code} is not a float type")
    return dt


def _like(t: torch.Tensor | None, x: torch.Tensor):
    return t if t is None or t.dtype == x.dtype else t.to(x.dtype)


# ----------------------------------------------------------------------------- BatchNormalization
def _bn_infer(ctx: NodeContext):
    out = [(ctx.dtype(0) or None, ctx.shape(0))]
    for k in range(1, ctx.n_outputs):
        src = 3 if k in (1, 3) else 4
        out.append((ctx.dtype(src) or None, ctx.shape(src)))
    return out


def _bcast_param(p: torch.Tensor, x: torch.Tensor):
    """A per-channel (C,) or, with spatial=0, per-activation (C, D1, ...) parameter for x."""
    if p.dim() <= 1:
        return p.reshape((1, -1) + (1,) * (x.dim() - 2))
    return p.unsqueeze(0)


@register("BatchNormalization", since=7, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=_bn_infer,
          precision=NORMALISATION)
def _batch_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon", 1e-5))
    momentum = float(ctx.attr("momentum", 0.9))
    if ctx.version >= 14:
        training = bool(ctx.attr("training_mode", 0))
        if ctx.n_outputs > 3:
            raise ctx.unsupported("more than 3 outputs")
    else:
        training = ctx.n_outputs > 1
    n_out = ctx.n_outputs

    def infer_bn(x, scale, b, mean, var):
        scale, b, mean, var = (_like(t, x) for t in (scale, b, mean, var))
        if scale.dim() <= 1 and mean.dim() <= 1:
            return F.batch_norm(x, mean, var, scale, b, False, 0.0, eps)
        p = _bcast_param
        return (x - p(mean, x)) / torch.sqrt(p(var, x) + eps) * p(scale, x) + p(b, x)

    if not training:
        return infer_bn

    def train_bn(x, scale, b, mean, var):
        dims = [0] + list(range(2, x.dim()))
        bm = x.mean(dim=dims)
        bv = x.var(dim=dims, unbiased=False)
        y = infer_bn(x, scale, b, bm, bv)
        rm = (mean * momentum + bm.to(mean.dtype) * (1 - momentum)).to(mean.dtype)
        rv = (var * momentum + bv.to(var.dtype) * (1 - momentum)).to(var.dtype)
        outs = (y, rm, rv, bm.to(mean.dtype), bv.to(var.dtype))
        return outs[:n_out]
    return train_bn


# ----------------------------------------------------------------------------- InstanceNormalization
@register("InstanceNormalization", since=6, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=same_as_input(0), precision=NORMALISATION)
def _instance_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon", 1e-5))

    def instance_norm(x, scale, b):
        return F.instance_norm(x, None, None, _like(scale, x), _like(b, x), True, 0.0, eps)
    return instance_norm


# ----------------------------------------------------------------------------- LayerNormalization
def _ln_infer(ctx: NodeContext):
    shape = ctx.shape(0)
    out = [(ctx.dtype(0) or None, shape)]
    if ctx.n_outputs > 1:
        stat_shape = None
        if shape is not None:
            a = normalize_axis(int(ctx.attr("axis", -1)), len(shape))
            stat_shape = tuple(shape[:a]) + (1,) * (len(shape) - a)
        stash = DType(int(ctx.attr("stash_type", 1)))
        out += [(stash, stat_shape)] * (ctx.n_outputs - 1)
    return out


def layer_norm_exact(x, norm_shape, scale, b, eps: float):
    """``F.layer_norm``; a float32 result holding a NaN or an Inf is computed again in float64,
    as onnxruntime accumulates (float32 sums of a finite row of values near 1e37 overflow, and
    the row comes out NaN); a row with a NaN or an Inf in it stays NaN. One sum decides: on
    the host; on a GPU on the device (both results computed, one kept)."""
    y = F.layer_norm(x, norm_shape, scale, b, eps)
    if y.dtype != torch.float32 or not y.numel():
        return y
    if y.device.type != "cpu":      # no host sync: it would stall the streams, and a CUDA graph cannot hold it
        return torch.where(torch.isfinite(y.sum()), y, _layer_norm_float64(x, norm_shape, scale, b, eps))
    if not bool(torch.isfinite(y.sum())):
        y = _layer_norm_float64(x, norm_shape, scale, b, eps)
    return y


def _layer_norm_float64(x, norm_shape, scale, b, eps: float):
    return F.layer_norm(x.double(), norm_shape, None if scale is None else scale.double(),
                        None if b is None else b.double(), eps).float()


def layer_norm_range(n_data: int):
    """The transfer of a layer norm over the axes from ``axis`` on (attribute, default -1) of
    the sum of its first ``n_data`` inputs, then scale and shift (the next two inputs, each
    optional): a normalised row of d elements has no element above sqrt(d), so the output is
    below sqrt(d) |scale| + |shift| whatever the input, NaN where the input holds NaN or inf
    (or the scale or shift does). A second output, where there is one, is the sum itself (the
    residual stream) or its mean."""
    def transfer(node, ins: list[Fact]) -> list[Fact]:
        shape, axis = node.outputs[0].shape, int(node.attrs.get("axis", -1))
        dims = tuple(shape[axis:]) if shape is not None and -len(shape) <= axis < len(shape) else ()
        if not dims or not all(isinstance(d, int) for d in dims):
            return [UNKNOWN] * len(node.outputs)
        data = ins[:n_data]
        present = [len(node.inputs) > k and node.inputs[k] is not None for k in (n_data, n_data + 1)]
        scale = ins[n_data] if present[0] else Fact(1.0)
        shift = ins[n_data + 1] if present[1] else Fact(0.0)
        y = Fact(math.sqrt(math.prod(dims)) * scale.bound + shift.bound,
                 any(f.nan or f.inf for f in data) or scale.nan or scale.inf or shift.nan, scale.inf or shift.inf)
        return [y, sum_fact(*data)][:len(node.outputs)]
    return transfer


@register("LayerNormalization", since=17, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=_ln_infer,
          precision=NORMALISATION, value_range=layer_norm_range(1))
def _layer_norm(ctx: NodeContext):
    axis = int(ctx.attr("axis", -1))
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = _stash(ctx)
    n_out = ctx.n_outputs

    def layer_norm(x, scale, b=None):
        a = axis + x.dim() if axis < 0 else axis
        norm_shape = tuple(x.shape[a:])
        ft = torch.promote_types(x.dtype, stash)
        if (n_out == 1 and ft == x.dtype and tuple(scale.shape) == norm_shape
                and (b is None or tuple(b.shape) == norm_shape)):
            return layer_norm_exact(x, norm_shape, _like(scale, x), _like(b, x), eps)
        dims = tuple(range(a, x.dim()))
        xs = x.to(ft)
        mean = xs.mean(dim=dims, keepdim=True)
        d = xs - mean
        inv = torch.rsqrt((d * d).mean(dim=dims, keepdim=True) + eps)
        y = (d * inv).to(x.dtype) * scale
        if b is not None:
            y = y + b
        y = y.to(x.dtype)
        if n_out == 1:
            return y
        return (y, mean.to(stash), inv.to(stash))[:n_out]
    return layer_norm


# ----------------------------------------------------------------------------- GroupNormalization
@register("GroupNormalization", since=18, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=same_as_input(0), precision=NORMALISATION)
def _group_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon", 1e-5))
    groups = int(ctx.attr("num_groups"))
    per_group = ctx.version < 21  # opset 18: one scale / bias per group
    stash = _stash(ctx) if ctx.version >= 21 else torch.float32

    def group_norm(x, scale, b):
        c = x.shape[1]
        if per_group:
            scale = scale.repeat_interleave(c // groups)
            b = b.repeat_interleave(c // groups)
        xs = x.to(torch.promote_types(x.dtype, stash))
        y = F.group_norm(xs, groups, None, None, eps).to(x.dtype)
        return y * _bcast_param(_like(scale, x), x) + _bcast_param(_like(b, x), x)
    return group_norm


# ----------------------------------------------------------------------------- RMSNormalization
def _rms_infer(ctx: NodeContext):
    return [(ctx.dtype(1) or None, ctx.shape(0))]


@register("RMSNormalization", since=23, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=_rms_infer)
def _rms_norm(ctx: NodeContext):
    axis = int(ctx.attr("axis", -1))
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = _stash(ctx)

    def rms_norm(x, scale):
        a = axis + x.dim() if axis < 0 else axis
        dims = tuple(range(a, x.dim()))
        xs = x.to(torch.promote_types(x.dtype, stash))
        y = (xs * torch.rsqrt((xs * xs).mean(dim=dims, keepdim=True) + eps)).to(x.dtype)
        return (y * scale).to(scale.dtype)
    return rms_norm


# ----------------------------------------------------------------------------- LRN
def _lrn_range(node, ins: list[Fact]) -> list[Fact]:
    """x / (bias + alpha / size * sum of squares) ^ beta: with bias > 0 and alpha, beta >= 0
    the divisor is at least bias ^ beta."""
    alpha, beta, bias = (float(node.attrs.get(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    x = ins[0]
    bounded = bias > 0 and alpha >= 0 and beta >= 0
    return [Fact(x.bound / bias ** beta if bounded else math.inf, x.nan or x.inf)]


@register("LRN", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True, infer=same_as_input(0),
          precision=(Precision.KEEP, "a windowed sum of squares and a power: float32"), value_range=_lrn_range)
def _lrn(ctx: NodeContext):
    size = int(ctx.attr("size"))
    alpha = float(ctx.attr("alpha", 1e-4))
    beta = float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2

    def lrn(x):
        n, c = x.shape[0], x.shape[1]
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            # channels-last data (passes/layout.py): windows along the contiguous channel axis
            h, w = x.shape[2], x.shape[3]
            sq = (x * x).permute(0, 2, 3, 1).reshape(n * h * w, 1, c)
            sums = sum_pool(F.pad(sq, (lo, hi)), (size,), (1,), (1,)).view(n, h, w, c).permute(0, 3, 1, 2)
            return x / (bias + (alpha / size) * sums) ** beta
        sq = (x * x).reshape(n, 1, c, -1)
        sums = sum_pool(F.pad(sq, (0, 0, lo, hi)), (size, 1), (1, 1), (1, 1)).reshape(x.shape)
        return x / (bias + (alpha / size) * sums) ** beta
    return lrn


# ----------------------------------------------------------------------------- MeanVarianceNormalization
@register("MeanVarianceNormalization", since=9, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=same_as_input(0))
def _mvn(ctx: NodeContext):
    axes = [int(a) for a in ctx.attr("axes", [0, 2, 3])]

    def mvn(x):
        dims = tuple(a + x.dim() if a < 0 else a for a in axes)
        mean = x.mean(dim=dims, keepdim=True)
        var = (x * x).mean(dim=dims, keepdim=True) - mean * mean
        return (x - mean) / (torch.sqrt(var) + 1e-9)
    return mvn


# ----------------------------------------------------------------------------- LpNormalization
@register("LpNormalization", since=1, fusion=FusionKind.OPAQUE, layout_sensitive=True,
          infer=same_as_input(0))
def _lp_norm(ctx: NodeContext):
    axis = int(ctx.attr("axis", -1))
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"p={p} (only 1 and 2 are defined)")

    def lp_norm(x):
        norm = torch.linalg.vector_norm(x, ord=p, dim=axis, keepdim=True)
        return torch.where(norm == 0, torch.zeros((), dtype=x.dtype, device=x.device), x / norm)
    return lp_norm
