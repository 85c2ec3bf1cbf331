"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12 on).

Input [N, C] or [N, C, d1, ...], target [N] or [N, d1, ...], optional per-class weight [C];
``reduction`` none / sum / mean (mean divides by the summed weights of non-ignored targets);
``ignore_index`` targets contribute nothing. SoftmaxCrossEntropyLoss may also return the
log-probabilities (its optional second output).
"""
from __future__ import annotations

import torch

from ..ir import DType
from .registry import FusionKind, NodeContext, register

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16)
_REDUCTIONS = ("none", "sum", "mean")


def _nll(logp: torch.Tensor, target: torch.Tensor, weight, ignore, reduction: str):
    """ONNX NLL over log-probabilities ``logp`` [N, C, ...] and targets [N, ...]."""
    t = target.to(torch.int64)
    mask = None if ignore is None else t != ignore
    safe = t if mask is None else torch.where(mask, t, torch.zeros_like(t))
    picked = -torch.gather(logp, 1, safe.unsqueeze(1)).squeeze(1)
    if weight is not None:
        w = weight.to(logp.dtype)[safe]
        if mask is not None:
            w = w * mask.to(logp.dtype)
    elif mask is not None:
        w = mask.to(logp.dtype)
    else:
        w = None
    loss = picked if w is None else picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if w is None:
        return loss.mean()
    return loss.sum() / w.sum()


def _check(ctx: NodeContext):
    if ctx.dtype(0) not in _FLOATS:
        raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
    reduction = ctx.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise ctx.unsupported(f"reduction {reduction!r}")
    ignore = ctx.attr("ignore_index", None)
    return reduction, None if ignore is None else int(ignore)


def _loss_shape(ctx: NodeContext, reduction: str):
    if reduction != "none":
        return ()
    return ctx.shape(1)


def _nll_infer(ctx: NodeContext):
    return [(ctx.dtype(0) or None, _loss_shape(ctx, ctx.attr("reduction", "mean")))]


def _sce_infer(ctx: NodeContext):
    dt = ctx.dtype(0) or None
    out = [(dt, _loss_shape(ctx, ctx.attr("reduction", "mean")))]
    if ctx.n_outputs > 1:
        out.append((dt, ctx.shape(0)))
    return out


@register("NegativeLogLikelihoodLoss", since=12, fusion=FusionKind.OPAQUE, infer=_nll_infer)
def _build_nll(ctx: NodeContext):
    reduction, ignore = _check(ctx)

    def kernel(x, target, weight=None):
        return _nll(x, target, weight, ignore, reduction)
    return kernel


@register("SoftmaxCrossEntropyLoss", since=12, fusion=FusionKind.OPAQUE, infer=_sce_infer)
def _build_sce(ctx: NodeContext):
    reduction, ignore = _check(ctx)
    want_log_prob = ctx.n_outputs > 1

    def kernel(scores, labels, weight=None):
        logp = torch.log_softmax(scores, 1)
        loss = _nll(logp, labels, weight, ignore, reduction)
        return (loss, logp) if want_log_prob else loss
    return kernel
