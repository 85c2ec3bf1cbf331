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
(``ops/norm.layer_norm_exact``): a result holding a NaN or an infinity is computed again in
float64 (a row with a NaN stays NaN); one sum decides. Float32 data and output (a node with
``out_dtype`` keeps its own kernel), gamma and beta float32 constants of the last axis'
size; anything else declines with a reason.
"""
from __future__ import annotations

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

    def normalise(x, y):
        rows = x.numel() // d if d else 0
        stats = workspace.at_least(8 * max(rows, 1))[:8 * rows].view(torch.float32)
        mean, rstd = stats[:rows].view(*x.shape[:-1], 1), stats[rows:].view(*x.shape[:-1], 1)
        _native_layer_norm(x, [d], gamma, beta, eps, out0=y, out1=mean, out2=rstd)
        if y.numel() and not bool(torch.isfinite(y.sum())):        # as layer_norm_exact: float64 again
            y.copy_(torch.nn.functional.layer_norm(x.double(), [d], None if gamma is None else gamma.double(),
                                                   None if beta is None else beta.double(), eps))
        return y

    return row_norm_kernel(normalise, skip, skip and len(node.outputs) == 2)
