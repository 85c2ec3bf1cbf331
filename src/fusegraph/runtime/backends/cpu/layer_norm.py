"""``fusegraph::LayerNorm`` / ``fusegraph::SkipLayerNorm`` over the last axis, written into
planned memory, for shapes known only at run time (the oneDNN kernel, ``dnnl/layernorm.py``,
is made for one shape).

SkipLayerNorm's sum ``s = a + b`` is written into its second output when the node gives the
residual stream, else into the normalised output's own bytes; then ATen's layer norm writes
the normalised rows into the output (``native_layer_norm.out``, in place over the sum in the
second case: each row's statistics are taken before the row is written,
``tests/runtime/test_symbolic_kernels.py`` checks it against the out-of-place result bit for
bit; its row statistics go to the backend's per-thread workspace, never to a fresh
allocation). Exact as the op's own kernel
(``ops/norm.layer_norm_exact``): data holding a NaN, an infinity or a value so large that a
row's float32 sum of squares may overflow is normalised in float64 (a row with a NaN stays
NaN), decided by one ``aminmax`` of the data before anything is written (the skip form
normalises over the sum's own bytes); a result that still holds a NaN or an infinity is
computed again in float64 where the data was not overwritten. Float32 data and output (a node with
``out_dtype`` keeps its own kernel), gamma and beta float32 constants of the last axis'
size; anything else declines with a reason.
"""
from __future__ import annotations

import math

import torch

from ..protocol import Decline
from .row_norm import float32_rows, row_norm_kernel, row_parameter

_native_layer_norm = torch.ops.aten.native_layer_norm.out


def layer_norm_kernel(ctx, workspace):
    node = ctx.node
    skip = node.op_type == "SkipLayerNorm"
    first = 2 if skip else 1
    d = float32_rows(ctx, first)
    if isinstance(d, Decline):
        return d
    why = "gamma and beta must be float32 constants of the last axis' size"
    gamma, beta = row_parameter(ctx, first, d, why), row_parameter(ctx, first + 1, d, why)
    for p in (gamma, beta):
        if isinstance(p, Decline):
            return p
    eps = float(ctx.attr("epsilon"))
    risk = math.sqrt(torch.finfo(torch.float32).max / max(d, 1)) / 2    # a row's sum of squares may overflow

    def exact(x, y):                # as layer_norm_exact: in float64, from ``x`` (read before ``y`` is written)
        y.copy_(torch.nn.functional.layer_norm(x.double(), [d], None if gamma is None else gamma.double(),
                                               None if beta is None else beta.double(), eps))
        return y

    def normalise(x, y):
        if not y.numel():
            return y
        lo, hi = torch.aminmax(x)
        if not max(-float(lo), float(hi)) < risk:       # NaN, an infinity, or a row that may overflow
            return exact(x, y)
        rows = x.numel() // d if d else 0
        stats = workspace.at_least(8 * max(rows, 1))[:8 * rows].view(torch.float32)
        mean, rstd = stats[:rows].view(*x.shape[:-1], 1), stats[rows:].view(*x.shape[:-1], 1)
        _native_layer_norm(x, [d], gamma, beta, eps, out0=y, out1=mean, out2=rstd)
        if not math.isfinite(float(y.sum())) and y.data_ptr() != x.data_ptr():
            exact(x, y)             # finite data of moderate size: only gamma / beta can overflow it
        return y

    return row_norm_kernel(normalise, skip, skip and len(node.outputs) == 2)
