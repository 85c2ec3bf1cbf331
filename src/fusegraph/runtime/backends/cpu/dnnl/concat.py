"""``Concat`` of bfloat16 tensors with static shapes as one oneDNN concat primitive, in the
tensors' own layouts (channels-last in conv nets: a channel concat interleaves the inputs per
pixel), into the planned output. A pure data movement: the result is the op's own kernel's
bit for bit. Float32 concats decline: against ``torch.cat`` in the same process the primitive
was faster on inception_v1 / v2 but slower on densenet121 (its concats append a few channels to
a wide tensor); in bfloat16 faster on both and level on squeezenet (benchmarks/RESULTS.md,
"Mixed precision against OpenVINO bf16 (issue 16)").
"""
from __future__ import annotations

import ctypes as C

import torch

from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .layouts import dtype_of, static_shape, strides_of
from .memory import MemDesc
from .primitive import Attr, Primitive


def concat_kernel(ctx, resources):
    node = ctx.node
    ins, y_v = list(node.inputs), node.outputs[0]
    ys = static_shape(y_v)
    dtype = dtype_of(y_v)
    if any(v is None for v in ins) or ys is None or dtype != torch.bfloat16:
        return Decline("needs bfloat16 inputs of static shape (float32: torch.cat is as fast)", "dnnl")
    shapes = [static_shape(v) for v in ins]
    if any(s is None or len(s) != len(ys) for s in shapes) or any(dtype_of(v) != dtype for v in ins):
        return Decline("needs inputs of the output's rank and type", "dnnl")
    rank = len(ys)
    axis = int(ctx.attr("axis", 1 if ctx.version < 4 else 0))
    axis = axis + rank if axis < 0 else axis
    if any(s[axis] == 0 for s in shapes):
        return Decline("an empty input", "dnnl")
    srcs = [MemDesc.of(s, dtype, strides_of(v)) for s, v in zip(shapes, ins)]
    dst = MemDesc.of(ys, dtype, strides_of(y_v))
    lib = capi.load()
    attr = Attr()
    pd = capi.vp()
    handles = (capi.vp * len(srcs))(*[md.handle for md in srcs])
    status = lib.concat_primitive_desc_create(C.byref(pd), lib.engine, dst.handle, len(srcs), axis, handles,
                                              attr.handle)
    if status != 0:
        return Decline(f"oneDNN has no concat for these layouts (status {status})", "dnnl")
    prim = Primitive(pd, "concat")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference concat ({prim.impl})", "dnnl")
    slots = [Slot(capi.ARG_MULTIPLE_SRC + i, s, strides_of(v), dtype, md)
             for i, (s, v, md) in enumerate(zip(shapes, ins, srcs))]
    return DnnlKernel(prim, slots, Slot(capi.ARG_DST, ys, strides_of(y_v), dtype, dst), [], resources,
                      tuple(range(len(ins))), keep=(attr,))
