"""Softmax as oneDNN's ``softmax_accurate`` primitive, exact on NaN and infinities.

A float32 Softmax (the precision policy keeps every softmax in float32) with a static shape,
read and written in row-major order (size-1 axes aside: a ``[1, 1000, 1, 1]`` channels-last
tensor is row-major), seen as ``[outer, n, inner]`` (``[outer, n]`` when ``inner`` is 1: a
softmax along the last axis; oneDNN has only its reference kernel along another) and
normalised along ``n``: opset 13's ``axis``, or earlier opsets' flattened
``[prod(shape[:axis]), prod(shape[axis:])]`` matrix.

oneDNN's softmax is ONNX's for finite inputs only: a row holding a NaN comes out NaN at that
position alone, where ONNX's ``exp(x - max) / sum`` makes the whole row NaN (and so does a row
holding +inf, or only -inf). After each call a oneDNN sum of the input is read back (one
float): when it is not finite (a NaN or an infinity in the input, or a sum that overflows),
the op's own kernel recomputes the output. ``tests/runtime/test_dnnl_classifier_tail.py``
checks such rows.

It is a classifier's last kernel: made for one thread below ``SERIAL_ELEMENTS`` (a 1000-class
row gains nothing from a second), the pair runs several times faster than the op's own ATen
kernel called after a run's large kernels have evicted the interpreter's and ATen's data from
the caches (benchmarks/RESULTS.md, "direct calls; a classifier's tail on oneDNN").
``Config.fast_math`` drops the check. Anything else declines with its
reason.
"""
from __future__ import annotations

import ctypes as C
import math

import torch

from ...protocol import Decline
from ..threading_policy import threads_for
from . import capi
from .call import DnnlKernel, Slot
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .memory import MemDesc
from .primitive import Attr, create

TYPES = (torch.float32,)
SERIAL_ELEMENTS = 1 << 16


def _row_major(shape, strides) -> bool:
    return all(a == b for a, b, n in zip(strides, contiguous(shape), shape) if n != 1)


def softmax_kernel(ctx, opdef, resources, exact: bool = True):
    node = ctx.node
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    dtype = dtype_of(x_v)
    if xs is None or not xs or ys != xs or dtype not in TYPES or dtype_of(y_v) != dtype:
        return Decline("needs a float32 input of static shape and an output like it", "dnnl")
    if not (_row_major(xs, strides_of(x_v)) and _row_major(ys, strides_of(y_v))):
        return Decline("needs row-major input and output", "dnnl")
    rank = len(xs)
    axis = int(ctx.attr("axis", -1 if ctx.version >= 13 else 1))
    if not -rank <= axis < rank:
        return Decline(f"axis {axis} out of range for rank {rank}", "dnnl")
    axis %= rank
    outer = math.prod(xs[:axis])
    n, inner = (xs[axis], math.prod(xs[axis + 1:])) if ctx.version >= 13 else (math.prod(xs[axis:]), 1)
    dims = (outer, n) if inner == 1 else (outer, n, inner)      # the softmax axis is 1
    md = MemDesc.of(dims, dtype, contiguous(dims))
    flat = MemDesc.of((math.prod(xs),), dtype)
    total_md = MemDesc.of((1,), dtype)
    lib = capi.load()
    attrs = Attr(), Attr()
    with threads_for(math.prod(xs) < SERIAL_ELEMENTS):
        try:
            prim = create("softmax", lambda pd: lib.softmax_forward_primitive_desc_create(
                pd, lib.engine, capi.FORWARD_INFERENCE, capi.SOFTMAX_ACCURATE, md.handle, md.handle,
                1, attrs[0].handle))
            summed = create("softmax input sum", lambda pd: lib.reduction_primitive_desc_create(
                pd, lib.engine, capi.REDUCTION["sum"], flat.handle, total_md.handle, 0.0, 0.0, attrs[1].handle))
        except capi.DnnlError as exc:
            return Decline(f"oneDNN has no softmax for this node: {exc}", "dnnl")
    slow = [p.impl for p in (prim, summed) if p.is_reference]
    if slow:
        return Decline(f"oneDNN offers only its reference {' and '.join(slow)} here", "dnnl")
    fast = DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, strides_of(x_v), dtype, md)],
                      Slot(capi.ARG_DST, ys, strides_of(y_v), dtype, md), [], resources, (0,))
    if not exact:                         # Config.fast_math: no check
        return fast
    total = torch.zeros(1, dtype=dtype)
    check = DnnlKernel(summed, [Slot(capi.ARG_SRC, xs, strides_of(x_v), dtype, flat)],
                       Slot(capi.ARG_DST, (1,), (1,), dtype, total_md), [], resources, (0,))
    return ExactSoftmax(fast, check, total, opdef.build(ctx))


class ExactSoftmax:
    """oneDNN's softmax, then the sum of its input read back; the op's own kernel when that
    sum is not finite."""
    writes_out = True

    def __init__(self, fast: DnnlKernel, check: DnnlKernel, total: torch.Tensor, exact):
        self.fast, self.check, self.exact = fast, check, exact
        self.total = total                               # the check's output, kept alive here
        self._read = C.c_float.from_address(total.data_ptr())
        self.reads = (0,)
        self.impl = fast.impl

    def __call__(self, x, out=None):
        y = self.fast(x, out=out)
        self.check(x, out=self.total)
        if not math.isfinite(self._read.value):
            y.copy_(self.exact(x))
        return y
