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

from ....ir.shape import broadcast_shapes
from ..protocol import Decline

_native_layer_norm = torch.ops.aten.native_layer_norm.out


def layer_norm_kernel(ctx, workspace):
    node = ctx.node
    skip = node.op_type == "SkipLayerNorm"
    first = 2 if skip else 1
    x_v = node.inputs[0]
    if any(v is None or v.dtype is None or v.dtype.to_torch() != torch.float32 for v in node.inputs[:first]) \
            or any(o.dtype is None or o.dtype.to_torch() != torch.float32 for o in node.outputs) \
            or ctx.attr("out_dtype", None) is not None:
        return Decline("needs float32 data and outputs", "cpu")
    if x_v.shape is None or not x_v.shape or not isinstance(x_v.shape[-1], int):
        return Decline("needs the normalised axis' size", "cpu")
    d = int(x_v.shape[-1])
    params = []
    for i in (first, first + 1):
        t = ctx.const(i) if ctx.has_input(i) else None
        if ctx.has_input(i) and (t is None or t.dtype != torch.float32 or t.numel() != d):
            return Decline("gamma and beta must be float32 constants of the last axis' size", "cpu")
        params.append(None if t is None else t.reshape(d).contiguous())
    gamma, beta = params
    eps = float(ctx.attr("epsilon"))
    both = skip and len(node.outputs) == 2

    def normalise(x, y):
        rows = x.numel() // d if d else 0
        stats = workspace.at_least(8 * max(rows, 1))[:8 * rows].view(torch.float32)
        mean, rstd = stats[:rows].view(*x.shape[:-1], 1), stats[rows:].view(*x.shape[:-1], 1)
        _native_layer_norm(x, [d], gamma, beta, eps, out0=y, out1=mean, out2=rstd)
        if y.numel() and not bool(torch.isfinite(y.sum())):        # as layer_norm_exact: float64 again
            y.copy_(torch.nn.functional.layer_norm(x.double(), [d], None if gamma is None else gamma.double(),
                                                   None if beta is None else beta.double(), eps))
        return y

    if skip:
        def skip_layer_norm(a, b, _gamma=None, _beta=None, out=None):
            if out is None:
                shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))   # torch.broadcast_shapes imports sympy
                out = (torch.empty(shape), torch.empty(shape)) if both else torch.empty(shape)
            y, s = (out[0], out[1]) if both else (out, out)
            torch.add(a, b, out=s)
            normalise(s, y)               # ATen normalises a row in place when s is y
            return (y, s) if both else y
        skip_layer_norm.writes_out = True
        return skip_layer_norm

    def layer_norm(x, _gamma=None, _beta=None, out=None):
        return normalise(x, torch.empty_like(x) if out is None else out)
    layer_norm.writes_out = True
    return layer_norm
