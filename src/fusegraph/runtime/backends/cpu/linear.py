"""The CPU backend's kernels for ``fusegraph::LinearAct`` with a constant float32 weight
stored ``[N, K]`` (``trans_b``; the fusion rules store constant weights that way); the op
and its portable addmm kernel are in ``ops/fused_transformer.py``.

- a oneDNN 1x1 convolution partition (``onednn_graph_linear.py``: the fastest of oneDNN's
  kernels for these products), behind a ``Deferred``;
- else oneDNN's inner product (``mkldnn._linear_pointwise``) with the bias and activation as
  post-ops (relu and GELU in place after it: oneDNN's relu turns NaN into 0, its GELU +inf into
  NaN), on every intra-op thread: MKL's sgemm takes a slow generic path on AMD CPUs
  (``benchmarks/bench_gemv.py``, RESULTS.md). Both allocate their result (oneDNN has no
  ``out=``); weights over ``PACKED_COPY_BYTES`` take the inner product (no reordered copy).
Anything else declines to the portable kernel.
"""
from __future__ import annotations

import math

import torch

from ....ops.fused_transformer import ACTIVATIONS
from ..protocol import Decline, Deferred
from . import onednn_graph
from .onednn_graph_linear import linear_kernel

# A larger constant weight keeps the inner product over the plain weight: the 1x1-convolution
# partition holds a reordered copy, which for the CNNs' classifiers (VGG's 411 MB, AlexNet's
# 151 + 67 MB) would nearly double the process's memory (vgg19 peak RSS 1.4x -> 2.4x the
# weights) for a few percent of their run. BERT-base's products (9.4 MB) stay under it.
PACKED_COPY_BYTES = 16 << 20
# activation -> (oneDNN post-op, its algorithm) for mkldnn._linear_pointwise; the others
# (relu, gelu, gelu_tanh: not what ONNX computes on NaN / +inf) run after it in place
ONEDNN_ACTIVATIONS = {"none": ("none", ""), "sigmoid": ("sigmoid", ""), "tanh": ("tanh", ""),
                      "silu": ("swish", "")}
# and under Config.fast_math (exact away from NaN / Inf)
FAST_ACTIVATIONS = {"relu": ("relu", ""), "gelu": ("gelu", "none")}


def _why_not(ctx) -> str | None:
    if not ctx.attr("trans_b", 0):
        return "the weight is not stored [N, K]"
    w, b = ctx.const(1), ctx.const(2) if ctx.has_input(2) else None
    if w is None or w.device.type != "cpu":
        return "the weight is not a constant CPU tensor"
    if not (w.dim() == 2 and w.dtype == torch.float32 and w.is_contiguous() and w.numel() > 0):
        return "needs a non-empty contiguous 2-D float32 weight"
    if not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN"
    if ctx.dtype(0) is None or ctx.dtype(0).to_torch() != torch.float32:
        return "the input is not float32"
    if ctx.has_input(2) and (b is None or b.dtype != torch.float32 or b.dim() != 1):
        return "the bias is not a constant 1-D float32 tensor"
    return None


def _onednn_linear(w: torch.Tensor, b, activation: str, exact: bool = True):
    n, k = w.shape
    fused = ONEDNN_ACTIVATIONS if exact else {**ONEDNN_ACTIVATIONS, **FAST_ACTIVATIONS}
    attr, algorithm = fused.get(activation, ("none", ""))
    after = None if activation in fused else ACTIVATIONS[activation]
    bias = None if b is None else b.contiguous()
    linear = torch.ops.mkldnn._linear_pointwise

    def kernel(x, w_=None, b_=None):
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        y = linear(x2, w, bias, attr, [], algorithm)
        if after is not None:
            after(y)
        return y.view(*x.shape[:-1], n)
    kernel.writes_out = False
    return kernel


def linear_act_kernel(ctx, opdef, exact: bool = True):
    """The CPU kernel of one LinearAct node, or a ``Decline``."""
    name = ctx.attr("activation")
    if name != "none" and name not in ACTIVATIONS:
        return opdef.build(ctx)      # the op refuses it with its own typed error
    why = _why_not(ctx)
    if why is not None:
        return Decline(why, "onednn")
    w, b = ctx.const(1), ctx.const(2) if ctx.has_input(2) else None
    inner = _onednn_linear(w, b, name, exact)
    xs = ctx.shape(0)
    rows = math.prod(xs[:-1]) if xs is not None and all(isinstance(d, int) for d in xs) else None
    if not onednn_graph.AVAILABLE or rows == 0 or w.numel() * w.element_size() > PACKED_COPY_BYTES:
        return inner
    return Deferred(inner, lambda: linear_kernel(ctx.name, w, b, name, inner, rows, exact) or inner)
