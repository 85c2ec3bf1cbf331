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

from ....ir.shape import broadcast_shapes
from ..protocol import Decline


def rms_norm_kernel(ctx, workspace):
    node = ctx.node
    skip = node.op_type == "SkipRMSNorm"
    first = 2 if skip else 1
    x_v = node.inputs[0]
    if any(v is None or v.dtype is None or v.dtype.to_torch() != torch.float32 for v in node.inputs[:first]) \
            or any(o.dtype is None or o.dtype.to_torch() != torch.float32 for o in node.outputs) \
            or ctx.attr("out_dtype", None) is not None:
        return Decline("needs float32 data and outputs", "cpu")
    if x_v.shape is None or not x_v.shape or not isinstance(x_v.shape[-1], int):
        return Decline("needs the normalised axis' size", "cpu")
    d = int(x_v.shape[-1])
    gamma = ctx.const(first) if ctx.has_input(first) else None
    if ctx.has_input(first) and (gamma is None or gamma.dtype != torch.float32 or gamma.numel() != d):
        return Decline("gamma must be a float32 constant of the last axis' size", "cpu")
    gamma = None if gamma is None else gamma.reshape(d).contiguous()
    eps = float(ctx.attr("epsilon"))
    both = skip and len(node.outputs) == 2

    def normalise(x, y):
        rows = x.numel() // d if d else 0
        r = workspace.at_least(4 * max(rows, 1))[:4 * rows].view(torch.float32).view(*x.shape[:-1], 1)
        torch.linalg.vector_norm(x, 2, -1, keepdim=True, out=r)
        r.square_().div_(d).add_(eps).rsqrt_()
        torch.mul(x, r, out=y)
        if gamma is not None:
            y.mul_(gamma)
        return y

    if skip:
        def skip_rms_norm(a, b, _gamma=None, out=None):
            if out is None:
                shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))   # torch.broadcast_shapes imports sympy
                out = (torch.empty(shape), torch.empty(shape)) if both else torch.empty(shape)
            y, s = (out[0], out[1]) if both else (out, out)
            torch.add(a, b, out=s)
            normalise(s, y)
            return (y, s) if both else y
        skip_rms_norm.writes_out = True
        return skip_rms_norm

    def rms_norm(x, _gamma=None, out=None):
        return normalise(x, torch.empty_like(x) if out is None else out)
    rms_norm.writes_out = True
    return rms_norm
