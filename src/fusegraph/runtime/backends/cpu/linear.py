"""The CPU backend's kernels for ``fusegraph::LinearAct`` with a constant float32 or bfloat16 weight
stored ``[N, K]`` (``trans_b``; the fusion rules store constant weights that way); the op
and its portable addmm kernel are in ``ops/fused_transformer.py``.

- a oneDNN 1x1 convolution partition (``onednn_graph_linear.py``: the fastest of oneDNN's
  kernels for these products), behind a ``Deferred``;
- else oneDNN's inner product (``mkldnn._linear_pointwise``) with the bias and activation as
  post-ops (relu and GELU in place after it: oneDNN's relu turns NaN into 0, its GELU +inf into
  NaN), on every intra-op thread: MKL's sgemm takes a slow generic path on AMD CPUs
  (``benchmarks/bench_gemv.py``, RESULTS.md). Both allocate their result (oneDNN has no
  ``out=``); weights over ``PACKED_COPY_BYTES`` take the inner product (no reordered copy).
A float16 LinearAct runs the same kernels in float32 over a float32 copy of its weight
(``conv.fp32_twin``), its input upcast and its result rounded to float16 once (``FP16_COMPUTE``).
Anything else declines to the portable kernel.
"""
from __future__ import annotations

import math

import torch

from ....ops.fused_transformer import ACTIVATIONS
from ..protocol import Decline, Deferred
from . import onednn_graph
from .conv import ONEDNN_TYPES, fp16_io, fp32_twin
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


def _why_not(ctx, types=ONEDNN_TYPES) -> str | None:
    if not ctx.attr("trans_b", 0):
        return "the weight is not stored [N, K]"
    w, b = ctx.const(1), ctx.const(2) if ctx.has_input(2) else None
    if w is None or w.device.type != "cpu":
        return "the weight is not a constant CPU tensor"
    if not (w.dim() == 2 and w.dtype in types and w.is_contiguous() and w.numel() > 0):
        return f"needs a non-empty contiguous 2-D {' or '.join(str(t).split('.')[1] for t in types)} weight"
    if not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN"
    if ctx.dtype(0) is None or ctx.dtype(0).to_torch() != w.dtype:
        return "the input's type is not the weight's"
    if ctx.has_input(2) and (b is None or b.dtype != w.dtype or b.dim() != 1):
        return "the bias is not a constant 1-D tensor of the weight's type"
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
    w, b = ctx.const(1), ctx.const(2) if ctx.has_input(2) else None
    if w is not None and w.dtype == torch.float16 and FP16_COMPUTE == "fp32":
        why = _why_not(ctx, (torch.float16,))
        if why is not None:
            return Decline(why, "onednn")
        return fp16_io(_kernel(ctx, fp32_twin(w), None if b is None else b.float(), name, exact))
    why = _why_not(ctx)
    if why is not None:
        return Decline(why, "onednn")
    return _kernel(ctx, w, b, name, exact)


# float16 products compute in float32 over float16 storage: 128x768x768 at 2 threads fp16 addmm
# 0.62 ms, fp32 0.55 ms; BERT / GPT-2 level within noise (benchmarks/RESULTS.md, "fp16 on CPU")
FP16_COMPUTE = "fp32"      # "fp16": decline to the op's portable kernel (ATen's float16 addmm)


def _kernel(ctx, w, b, name, exact):
    inner = _onednn_linear(w, b, name, exact)
    xs = ctx.shape(0)
    rows = math.prod(xs[:-1]) if xs is not None and all(isinstance(d, int) for d in xs) else None
    if not onednn_graph.AVAILABLE or rows == 0 or w.numel() * w.element_size() > PACKED_COPY_BYTES:
        return inner
    return Deferred(inner, lambda: linear_kernel(ctx.name, w, b, name, inner, rows, exact) or inner)
