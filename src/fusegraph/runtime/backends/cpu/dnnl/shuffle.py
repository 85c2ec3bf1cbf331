"""``fusegraph::ChannelShuffle`` as one oneDNN reorder between two strided views: the channel
axis seen as ``[groups, C / groups]`` in the input and as its transpose in the output
(ShuffleNet's Reshape-Transpose-Reshape), in the tensors' own layouts, into the planned output;
float32, bfloat16, and the uint8 / int8 values of a quantised model.
oneDNN's shuffle primitive has only its reference kernel for channels-last data; its JIT
reorder moves the same bytes several times faster than ATen's channel shuffle here
(benchmarks/RESULTS.md, "Figures moved out of docstrings"). A pure data
movement: the result is the op's own kernel's bit for bit.
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

TYPES = (torch.float32, torch.bfloat16, torch.uint8, torch.int8)    # the 8-bit ones: a QDQ model's shuffles


def _split(shape, strides, g: int, transposed: bool):
    """``shape`` / ``strides`` with the channel axis split into ``[g, C / g]``: channel
    ``i * C/g + j`` (input), or ``j * g + i`` (output, ``transposed``)."""
    n, c, *rest = shape
    sn, sc, *srest = strides
    inner = (sc, g * sc) if transposed else ((c // g) * sc, sc)
    return (n, g, c // g, *rest), (sn, *inner, *srest)


def shuffle_kernel(ctx, resources):
    node = ctx.node
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs = static_shape(x_v)
    dtype = dtype_of(x_v)
    g = int(ctx.attr("groups"))
    if xs is None or len(xs) < 2 or static_shape(y_v) != xs or dtype not in TYPES:
        return Decline("needs a float32 / bfloat16 / uint8 / int8 input of static shape", "dnnl")
    if g < 1 or xs[1] % g:
        return Decline(f"{xs[1]} channels do not split into {g} groups", "dnnl")
    x_strides, y_strides = strides_of(x_v), strides_of(y_v)
    (s_shape, s_strides), (d_shape, d_strides) = _split(xs, x_strides, g, False), _split(xs, y_strides, g, True)
    src, dst = MemDesc.of(s_shape, dtype, s_strides), MemDesc.of(d_shape, dtype, d_strides)
    lib = capi.load()
    attr = Attr()
    pd = capi.vp()
    status = lib.reorder_primitive_desc_create(C.byref(pd), src.handle, lib.engine, dst.handle, lib.engine,
                                               attr.handle)
    if status != 0:
        return Decline(f"oneDNN has no reorder for this shuffle (status {status})", "dnnl")
    prim = Primitive(pd, "shuffle")
    if prim.impl.startswith(("simple", "ref")):     # AVX2's bfloat16: the generic element loop, far slower
        return Decline(f"oneDNN offers only its generic reorder for this shuffle ({prim.impl})", "dnnl")
    return DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, x_strides, dtype, src)],
                      Slot(capi.ARG_DST, xs, y_strides, dtype, dst), [], resources, (0,))
