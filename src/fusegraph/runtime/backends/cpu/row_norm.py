"""What the planned-memory norms over the last axis share (``layer_norm.py``, ``rms_norm.py``):
the checks that decide whether a node's rows can be normalised here (float32 data and
outputs, a static last axis, float32 constant parameters of its size), and the kernels around
a ``normalise(x, y)`` function: the plain norm, and the skip form that first writes
``s = a + b`` into its second output (the residual stream) or into the output's own bytes,
then normalises ``s`` in place there. No arithmetic of a norm lives here.
"""
from __future__ import annotations

from typing import Callable

import torch

from ....ir.shape import broadcast_shapes
from ..protocol import Decline


def float32_rows(ctx, first: int) -> int | Decline:
    """The normalised axis' size of ``ctx``'s node, whose first ``first`` inputs are the data,
    or a ``Decline`` saying why the node's rows are not float32 rows of a known size."""
    node = ctx.node
    x_v = node.inputs[0]
    if any(v is None or v.dtype is None or v.dtype.to_torch() != torch.float32 for v in node.inputs[:first]) \
            or any(o.dtype is None or o.dtype.to_torch() != torch.float32 for o in node.outputs) \
            or ctx.attr("out_dtype", None) is not None:
        return Decline("needs float32 data and outputs", "cpu")
    if x_v.shape is None or not x_v.shape or not isinstance(x_v.shape[-1], int):
        return Decline("needs the normalised axis' size", "cpu")
    return int(x_v.shape[-1])


def row_parameter(ctx, index: int, d: int, why: str) -> torch.Tensor | None | Decline:
    """Input ``index`` as a contiguous float32 vector of ``d`` (None where the node has no such
    input), or ``Decline(why)`` where it is not a float32 constant of that size."""
    if not ctx.has_input(index):
        return None
    t = ctx.const(index)
    if t is None or t.dtype != torch.float32 or t.numel() != d:
        return Decline(why, "cpu")
    return t.reshape(d).contiguous()


def row_norm_kernel(normalise: Callable, skip: bool, both: bool) -> Callable:
    """The node's kernel around ``normalise(x, y)`` (writes the norm of ``x``'s rows into ``y``
    and returns it): ``kernel(x, *params, out=None)``, or for a skip node ``kernel(a, b,
    *params, out=None)`` returning ``(y, s)`` where the node has both outputs."""
    if skip:
        def skip_norm(a, b, *_params, out=None):
            if out is None:
                shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))   # torch.broadcast_shapes imports sympy
                out = (torch.empty(shape), torch.empty(shape)) if both else torch.empty(shape)
            y, s = (out[0], out[1]) if both else (out, out)
            torch.add(a, b, out=s)
            normalise(s, y)               # a row's statistics are taken before it is written
            return (y, s) if both else y
        skip_norm.writes_out = True
        return skip_norm

    def norm(x, *_params, out=None):
        return normalise(x, torch.empty_like(x) if out is None else out)
    norm.writes_out = True
    return norm
