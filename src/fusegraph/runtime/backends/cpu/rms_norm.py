"""``fusegraph::RMSNorm`` / ``fusegraph::SkipRMSNorm`` over the last axis with ATen, written into
planned memory, for shapes known only at run time (the oneDNN kernel, ``dnnl/rmsnorm.py``, is
made for one shape).

Each row's sum of squares (``vector_norm`` squared, float32: a row whose squares overflow
normalises to 0 as the graph's float32 arithmetic does, NaN where x is infinite, and a NaN
makes its row NaN) goes to the backend's per-thread workspace, becomes ``1 / sqrt(sum / n +
eps)`` in place there, and the output is ``x`` times it (times gamma) into its slot.
SkipRMSNorm writes ``s = a + b`` first, into its second output when the node gives the
residual stream, else into the output's own bytes, normalised in place. Float32 data and
output, gamma a float32 constant of the last axis' size; anything else declines with its
reason (the op's own kernel runs).
"""
from __future__ import annotations

import torch

from ..protocol import Decline
from .row_norm import float32_rows, row_norm_kernel, row_parameter


def rms_norm_kernel(ctx, workspace):
    node = ctx.node
    skip = node.op_type == "SkipRMSNorm"
    first = 2 if skip else 1
    d = float32_rows(ctx, first)
    if isinstance(d, Decline):
        return d
    gamma = row_parameter(ctx, first, d, "gamma must be a float32 constant of the last axis' size")
    if isinstance(gamma, Decline):
        return gamma
    eps = float(ctx.attr("epsilon"))

    def normalise(x, y):
        rows = x.numel() // d if d else 0
        r = workspace.at_least(4 * max(rows, 1))[:4 * rows].view(torch.float32).view(*x.shape[:-1], 1)
        torch.linalg.vector_norm(x, 2, -1, keepdim=True, out=r)
        r.square_().div_(d).add_(eps).rsqrt_()
        torch.mul(x, r, out=y)
        if gamma is not None:
            y.mul_(gamma)
        return y

    return row_norm_kernel(normalise, skip, skip and len(node.outputs) == 2)
