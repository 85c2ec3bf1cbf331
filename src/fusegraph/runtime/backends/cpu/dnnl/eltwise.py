"""A standalone ``Gelu`` (ONNX's, or fusegraph's without a bias) as oneDNN's eltwise primitive
(``gelu_erf`` / ``gelu_tanh``): its fast form, for the guard.

A GELU between two nodes it cannot fuse into (in a QDQ transformer: between a product's
float32 output and the next QuantizeLinear) ran as ATen's kernel, whose tanh form is several
times slower than its erf form; oneDNN computes either in one vectorised pass. It agrees with
ONNX's formula on finite inputs to float32 rounding (the tanh form's saturation gives 0 where
the exact value is below about 1e-6 in magnitude), not on infinities and NaN, so it is only
the fast form of a guarded node (``guard_plan.py``): the op's own kernel (which keeps +inf
and NaN as ONNX says) runs whenever a run's inputs could bring a non-finite value to it.
Float32 or bfloat16 (a mixed-precision model's GELU, computed in float32 inside and rounded
once, as the op's own bfloat16 kernel is), static shapes, input and output in one dense
layout; made for one thread below ``SERIAL_ELEMENTS``.
"""
from __future__ import annotations

import math

import torch

from ...protocol import Decline
from ..threading_policy import threads_for
from . import capi
from .call import DnnlKernel, Slot
from .layouts import dtype_of, static_shape, strides_of
from .memory import MemDesc
from .primitive import Attr, create

ALGORITHMS = {"none": "gelu_erf", "tanh": "gelu_tanh"}
TYPES = (torch.float32, torch.bfloat16)       # a bfloat16 GELU is computed in float32 inside, rounded once
SERIAL_ELEMENTS = 1 << 15


def gelu_kernel(ctx, resources, exact: bool = True):
    """The oneDNN kernel of one Gelu node's fast form, or a ``Decline`` saying why not."""
    if exact:
        return Decline("oneDNN's GELU is ONNX's for finite inputs only: the op's own kernel is the exact form", "dnnl")
    node = ctx.node
    if any(v is not None for v in node.inputs[1:]):
        return Decline("a GELU with a bias (fusegraph::Gelu's second input)", "dnnl")
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    approximate = str(ctx.attr("approximate", "none"))
    if approximate not in ALGORITHMS:
        return Decline(f"approximate={approximate!r}", "dnnl")
    dtype = dtype_of(x_v)
    if xs is None or ys != xs or dtype not in TYPES or dtype_of(y_v) != dtype:
        return Decline("needs a float32 or bfloat16 input of static shape and an output like it", "dnnl")
    strides = strides_of(x_v)
    if strides_of(y_v) != strides:
        return Decline("input and output in different layouts", "dnnl")
    md = MemDesc.of(xs, dtype, strides)
    lib = capi.load()
    attr = Attr()
    try:
        with threads_for(math.prod(xs) < SERIAL_ELEMENTS):
            prim = create("gelu", lambda pd: lib.eltwise_forward_primitive_desc_create(
                pd, lib.engine, capi.FORWARD_INFERENCE, capi.ELTWISE[ALGORITHMS[approximate]], md.handle,
                md.handle, 0.0, 0.0, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no eltwise GELU for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference eltwise GELU ({prim.impl})", "dnnl")
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, strides, dtype, md)],
                      Slot(capi.ARG_DST, ys, strides, dtype, md), [], resources, (0,), keep=(attr,))
