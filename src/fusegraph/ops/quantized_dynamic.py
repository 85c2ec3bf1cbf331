"""``fusegraph::QLinearDynamic``: a product whose activation was quantised at run time, what
onnxruntime's ``quantize_dynamic`` writes for a MatMul with a constant weight
(``passes/dynamic_quant.py`` makes it):

    DynamicQuantizeLinear(x) -> (x_q, x_scale, x_zp)
    MatMulInteger(x_q, W_q, x_zp, W_zp) -> Cast(float32) -> Mul(x_scale * W_scale) [-> Add(b)]

becomes ``QLinearDynamic(x_q, x_scale, x_zp, w, w_scale, b?)``: ``x_q`` uint8 ``[..., K]``
with its scale (float32, one value) and zero point (uint8, one value) as *inputs*, computed
at run time by the ``DynamicQuantizeLinear`` node that stays in the graph (one node can feed
several products: a transformer's query, key and value read one quantised input); ``w`` an
int8 weight ``[K, N]`` of zero point 0 (the rule folds a zero point in where the weight minus
it fits int8); ``w_scale`` one float32 per column N or one; ``b`` an optional float32 bias of
N. The output is float32: ``float(sum_k (x_q - x_zp) * w) * (x_scale * w_scale) + b``, the
model's own arithmetic in its own order (the integer sum exact, converted to float32, times
the float32 product of the two scales, plus the bias).

The op's own kernel is that form, portable ATen (the integer sum exact in float64:
``linalg.int_matmul``). The CPU backend's kernel (``runtime/backends/cpu/dnnl/
linear_dynamic_int8.py``) is one oneDNN int8 matmul with the run-time scale and zero point
as its arguments. No value-range transfer: the scale is known at run time only, so no bound
follows through (the conservative default). No pass logic here.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .linalg import int_matmul
from .registry import FusionKind, NodeContext, register

DOMAIN = "fusegraph"


def _shape(ctx: NodeContext):
    xs, ws = ctx.shape(0), ctx.shape(3)
    if ws is not None and len(ws) != 2:
        raise ValueError(f"QLinearDynamic weight must be 2-D, got rank {len(ws)}")
    if xs is None or ws is None:
        return None
    return tuple(xs[:-1]) + (ws[1],)


def _infer(ctx: NodeContext):
    return [(DType.FLOAT, _shape(ctx))]


def _check(ctx: NodeContext) -> None:
    expected = {0: DType.UINT8, 1: DType.FLOAT, 2: DType.UINT8, 3: DType.INT8, 4: DType.FLOAT}
    for i, dt in expected.items():
        got = ctx.dtype(i)
        if got is not None and got != dt:
            raise ctx.unsupported(f"input {i} of type {got.name} (expected {dt.name})")


@register("QLinearDynamic", domain=DOMAIN, since=1, fusion=FusionKind.OPAQUE, infer=_infer, writes_out=True)
def _qlinear_dynamic(ctx: NodeContext):
    _check(ctx)

    def qlinear_dynamic(x, x_scale, x_zp, w, w_scale, b=None, out=None):
        acc = int_matmul(x, w, x_zp, None).to(torch.int32).to(torch.float32)
        y = acc * (x_scale.reshape(()).to(torch.float32) * w_scale.to(torch.float32).reshape(-1))
        if b is not None:
            y = y + b.to(torch.float32)
        if out is None:
            return y
        out.copy_(y)
        return out
    return qlinear_dynamic
