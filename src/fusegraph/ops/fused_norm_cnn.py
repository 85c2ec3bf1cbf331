"""Normalisations of conv nets' channels in domain ``fusegraph`` (version 1), made by
``passes/fusion/rules_norm_cnn.py``:

- ``ChannelLayerNorm(x, gamma?, beta?)``: a layer norm over the channel axis (axis 1) of a
  ``[N, C, ...]`` tensor, ``epsilon``: what ConvNeXt's "channels_first" LayerNorm and HuBERT's
  conv feature encoder export as ``Transpose(channels last) -> LayerNormalization(axis=-1) ->
  Transpose(back)``. On channels-last data (``passes/layout.py``) the channels of a pixel are
  one contiguous row: the CPU backend runs oneDNN's layer normalisation over those rows
  (``dnnl/layernorm.py``). The op's own kernel is ``norm.layer_norm_exact`` over the channels
  moved last (a view of channels-last data), written back through ``out=`` in any layout.
- ``GroupNorm(x, scale, bias)``: ``groups`` groups of ``C / groups`` channels, each
  normalised over its channels and the spatial axes of one sample, then ``scale * y + bias``
  per channel, ``epsilon``: ONNX ``InstanceNormalization`` (``groups == C``), and the way
  PyTorch exports ``GroupNorm`` (``Reshape [N, G, -1] -> InstanceNormalization -> Reshape ->
  Mul -> Add``: wav2vec2's feature encoder). Its kernel: ``F.group_norm`` on contiguous data;
  on channels-last data (every sample's ``[S, C]`` rows contiguous, where ATen's own group
  norm of a 3-D tensor gathers it first) the statistics are one reduction over the rows and the
  result one multiply-add per element, written through ``out=`` into the planned layout.

Both compute in float32 (the precision policy keeps normalisation statistics float32);
ChannelLayerNorm's result is rounded once to its ``out_dtype`` where it has one (a Cast to
bfloat16 folded in, ``passes/fold_casts.py``).
No pass logic here; rules decide what fuses.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import product_out_dtype, rounding_to_out_dtype
from .norm import layer_norm_exact
from .precision_reasons import NORMALISATION
from .registry import FusionKind, NodeContext, register
from .value_range import UNKNOWN, Fact

DOMAIN = "fusegraph"


def _same(ctx: NodeContext):
    return [(ctx.dtype(0) or None, ctx.shape(0))]


def _normalised_range(node, ins: list[Fact]) -> list[Fact]:
    """A normalised group of n elements has none above sqrt(n): the output is below
    sqrt(n) |scale| + |shift| whatever the input, NaN where the input (or a parameter) holds NaN
    or inf. n: the channels (ChannelLayerNorm), or a group's channels times the spatial size
    (GroupNorm); unknown without static sizes."""
    shape = node.outputs[0].shape
    if shape is None or len(shape) < 2 or not all(isinstance(d, int) for d in shape[1:]):
        return [UNKNOWN]
    n = shape[1]
    if node.op_type == "GroupNorm":
        n = n // max(int(node.attrs.get("groups", 1)), 1) * math.prod(shape[2:])
    present = [len(node.inputs) > k and node.inputs[k] is not None for k in (1, 2)]
    scale = ins[1] if present[0] else Fact(1.0)
    shift = ins[2] if present[1] else Fact(0.0)
    return [Fact(math.sqrt(n) * scale.bound + shift.bound,
                 ins[0].nan or ins[0].inf or scale.nan or scale.inf or shift.nan, scale.inf or shift.inf)]


def channels_last_view(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` ``[N, C, ...]`` seen as ``[N, ..., C]`` when that view is contiguous (channels-last
    data), else None."""
    t = x.movedim(1, -1)
    return t if t.is_contiguous() and not x.is_contiguous() else None


# ---------------------------------------------------------------- ChannelLayerNorm

def _channel_ln_infer(ctx: NodeContext):
    return [(product_out_dtype(ctx), ctx.shape(0))]


@register("ChannelLayerNorm", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_channel_ln_infer,
          writes_out=True, precision=NORMALISATION, value_range=_normalised_range)
def _channel_layer_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon", 1e-5))
    rounded = rounding_to_out_dtype(ctx)

    def channel_layer_norm(x, gamma=None, beta=None, out=None):
        c = x.shape[1]
        y = rounded(layer_norm_exact(x.movedim(1, -1), (c,), gamma, beta, eps).movedim(-1, 1))
        return y.contiguous(memory_format=_format(x)) if out is None else out.copy_(y)
    return channel_layer_norm


def _format(x: torch.Tensor):
    return torch.channels_last if x.dim() == 4 and channels_last_view(x) is not None else torch.contiguous_format


# ---------------------------------------------------------------- GroupNorm

@register("GroupNorm", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_same, writes_out=True,
          precision=NORMALISATION, value_range=_normalised_range)
def _group_norm(ctx: NodeContext):
    eps = float(ctx.attr("epsilon", 1e-5))
    groups = int(ctx.attr("groups"))
    if groups < 1:
        raise ctx.unsupported(f"groups={groups}")

    def group_norm(x, scale, bias, out=None):
        rows = channels_last_view(x)
        if rows is None:
            y = F.group_norm(x if x.is_contiguous() else x.contiguous(), groups, scale, bias, eps)
            return y if out is None else out.copy_(y)
        return _group_norm_rows(x, rows, groups, scale, bias, eps, out)
    return group_norm


def _group_norm_rows(x, rows, groups: int, scale, bias, eps: float, out):
    """Group norm of channels-last ``x`` (``rows``: its ``[N, S..., C]`` view): the statistics of
    each (sample, group) over its rows and channels in float32 (mean, then variance about it),
    then ``x * a + b`` with the per-channel ``a = scale / sigma`` and ``b = bias - mean * a``,
    one pass."""
    n, c = x.shape[0], x.shape[1]
    per = c // groups
    g = rows.reshape(n, -1, groups, per).float()
    # two passes (the mean, then the mean square of the deviations): torch's one-pass var_mean
    # over these strided dims runs a scalar loop, several times slower than two sums
    mean = g.mean(dim=(1, 3), keepdim=True)
    var = (g - mean).square_().mean(dim=(1, 3))                           # [N, G]
    mean = mean.reshape(n, groups)
    a = scale.float().reshape(1, groups, per) * torch.rsqrt(var + eps).unsqueeze(-1)   # [N, G, per]
    b = bias.float().reshape(1, groups, per) - mean.unsqueeze(-1) * a
    shape = (n,) + (1,) * (x.dim() - 2) + (c,)
    a, b = a.reshape(shape), b.reshape(shape)
    target = None if out is None else out.movedim(1, -1)
    if target is not None and target.is_contiguous() and target.dtype == torch.float32 == x.dtype:
        torch.addcmul(b, rows, a, out=target)          # straight into the planned channels-last slot
        return out
    y = torch.addcmul(b, rows.float(), a).to(x.dtype).movedim(-1, 1)
    return y if out is None else out.copy_(y)
