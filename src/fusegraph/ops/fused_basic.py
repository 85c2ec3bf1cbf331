"""Replacement ops with no ONNX equivalent, in domain ``fusegraph`` (version 1).

Operator-replacement passes (``passes/replace_*.py``) create these; no frontend does.

- ``Linear(x, w, b?)``: ``x @ w + b`` in one kernel (``F.linear``, i.e. addmm). ``w`` is 2-D,
  ``[K, N]`` (MatMul layout) or ``[N, K]`` with ``trans_b=1`` (Gemm transB / torch layout);
  ``b`` is absent or ``[N]``. ``x`` has any rank >= 1. ``out_dtype`` (float32 for a bfloat16
  product: a Cast folded in, ``passes/fold_casts.py``): the products written unrounded.
- ``BatchMatMul(a, b)``: ``matmul(a^T?, b^T?)`` where ``trans_a`` / ``trans_b`` swap the last
  two axes of that operand (a strided view, no copy). Both operands have rank >= 2.
- ``ScaledReduce(x)``: a reduction of a tensor that was broadcast (``Expand``) before being
  reduced. ``x`` is first viewed at rank ``rank`` (leading 1s), reduced over ``axes`` with
  ``mode`` in sum | mean | max | min and ``keepdims``, then multiplied by ``scale`` (the
  number of broadcast copies each element stood for; 1 except for sum).

Inference functions handle symbolic dims; kernels are plain torch calls.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir.shape import broadcast_shapes
from .common import bias_like, product_out_dtype, widened, widens
from .precision_reasons import MATRIX_PRODUCT, REDUCTION
from .registry import FusionKind, NodeContext, no_out, register
from .value_range import ProductRange

DOMAIN = "fusegraph"


def _last(shape, k):
    return None if shape is None or len(shape) < k else shape[-k]


# ---------------------------------------------------------------- Linear

def _linear_infer(ctx: NodeContext):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if ws is not None and len(ws) != 2:
        raise ValueError(f"Linear weight must be 2-D, got rank {len(ws)}")
    dtype = product_out_dtype(ctx)
    if xs is None or ws is None:
        return [(dtype, None)]
    n = ws[0] if ctx.attr("trans_b", 0) else ws[1]
    return [(dtype, tuple(xs[:-1]) + (n,))]


def linear_terms(node) -> int | None:
    """The terms each output of a product with a 2-D weight ([K, N], or [N, K] under
    ``trans_b``) sums: K."""
    w = node.inputs[1].shape if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if w is None or len(w) != 2 or not all(isinstance(d, int) for d in w):
        return None
    return int(w[1] if node.attrs.get("trans_b") else w[0])


@register("Linear", domain=DOMAIN, since=1, fusion=FusionKind.OUT_FUSABLE, infer=_linear_infer,
          writes_out=True, precision=MATRIX_PRODUCT, value_range=ProductRange(linear_terms, activation=False))
def _linear(ctx: NodeContext):
    trans_b = bool(ctx.attr("trans_b", 0))

    def kernel(x, w, b=None):
        return F.linear(x, w if trans_b else w.t(), bias_like(b, x))
    xs = ctx.shape(0)
    if widens(ctx):
        return no_out(lambda x, w, b=None: kernel(*widened(x, w, b)))
    if xs is None or len(xs) != 2:
        return no_out(kernel)

    # 2-D input: what F.linear runs (addmm with a bias, else mm), in its out form
    def kernel_2d(x, w, b=None, out=None):
        wt = w.t() if trans_b else w
        b = bias_like(b, x)
        if b is None:
            return torch.mm(x, wt, out=out) if out is not None else F.linear(x, w if trans_b else w.t())
        return torch.addmm(b, x, wt, out=out) if out is not None else F.linear(x, w if trans_b else w.t(), b)
    return kernel_2d


# ---------------------------------------------------------------- BatchMatMul

def _bmm_infer(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    dtype = ctx.dtype(0) or None
    if a is None or b is None:
        return [(dtype, None)]
    if len(a) < 2 or len(b) < 2:
        raise ValueError("BatchMatMul operands must have rank >= 2")
    m = a[-1] if ctx.attr("trans_a", 0) else a[-2]
    n = b[-2] if ctx.attr("trans_b", 0) else b[-1]
    batch = broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return [(dtype, tuple(batch) + (m, n))]


@register("BatchMatMul", domain=DOMAIN, since=1, fusion=FusionKind.OUT_FUSABLE, infer=_bmm_infer,
          precision=MATRIX_PRODUCT)
def _bmm(ctx: NodeContext):
    ta, tb = bool(ctx.attr("trans_a", 0)), bool(ctx.attr("trans_b", 0))

    def kernel(a, b):
        return torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)
    return kernel


# ---------------------------------------------------------------- ScaledReduce

_REDUCERS = {
    "sum": lambda x, axes, keep: torch.sum(x, dim=axes, keepdim=keep),
    "mean": lambda x, axes, keep: torch.mean(x, dim=axes, keepdim=keep),
    "max": lambda x, axes, keep: torch.amax(x, dim=axes, keepdim=keep),
    "min": lambda x, axes, keep: torch.amin(x, dim=axes, keepdim=keep),
}


def _sr_infer(ctx: NodeContext):
    xs, rank = ctx.shape(0), int(ctx.attr("rank"))
    if xs is None:
        return [(ctx.dtype(0) or None, None)]
    if len(xs) > rank:
        raise ValueError(f"ScaledReduce input rank {len(xs)} exceeds rank={rank}")
    full = (1,) * (rank - len(xs)) + tuple(xs)
    axes = set(int(a) for a in ctx.attr("axes"))
    keep = int(ctx.attr("keepdims", 1))
    out = tuple(1 if i in axes else d for i, d in enumerate(full) if keep or i not in axes)
    return [(ctx.dtype(0) or None, out)]


@register("ScaledReduce", domain=DOMAIN, since=1, fusion=FusionKind.REDUCE, infer=_sr_infer, precision=REDUCTION)
def _scaled_reduce(ctx: NodeContext):
    mode = ctx.attr("mode")
    if mode not in _REDUCERS:
        raise ctx.unsupported(f"mode {mode!r} (expected one of {sorted(_REDUCERS)})")
    reduce = _REDUCERS[mode]
    rank, keep = int(ctx.attr("rank")), bool(int(ctx.attr("keepdims", 1)))
    axes = tuple(int(a) for a in ctx.attr("axes"))
    scale = ctx.attr("scale", 1.0)

    def kernel(x):
        if x.dim() < rank:
            x = x.reshape((1,) * (rank - x.dim()) + tuple(x.shape))
        y = reduce(x, axes, keep) if axes else x
        if scale != 1:
            y = y * (int(scale) if not y.is_floating_point() else scale)
        return y
    return kernel
