"""``fusegraph::RMSNorm`` / ``fusegraph::SkipRMSNorm`` as oneDNN layer normalisation with given
statistics, into the planned output.

oneDNN 3.2 has no RMS mode (``dnnl_rms_norm`` came in 3.3) and its reduction over the last
axis is only the reference one; its layer normalisation with ``use_global_stats`` computes
``(x - mean) / sqrt(var + eps) * scale``. So each row's sum of squares is taken first (one
ATen ``vector_norm`` pass into a buffer of the kernel's own, squared in place: ``rows``
values), and the primitive then runs with mean 0, that sum as the variance, ``eps * n`` as
epsilon and ``gamma * sqrt(n)`` as scale (``1 / sqrt(sum + n eps) * sqrt(n)`` is
``1 / sqrt(mean + eps)``): two passes over x instead of the graph's six kernels.

NaN and Inf as the graph computes them: the sum is float32 (a row whose squares overflow has
an infinite sum, so it normalises to 0, and to NaN where x itself is infinite); a NaN makes
its row NaN. SkipRMSNorm's sum ``s = a + b`` is written first (into its second output when the
node gives the residual stream, else into the normalised output's bytes, normalised in place).
Float32 data of static shape, row-major, the normalised axis last; the output float32 or
bfloat16 (``out_dtype``, oneDNN rounds once) where it has its own bytes; gamma a float32
constant. Anything else declines with its reason (``cpu/decoder.py`` runs symbolic shapes).
"""
from __future__ import annotations

import math

import torch

from ...protocol import Decline
from . import capi
from .call import DnnlKernel, Slot
from .layouts import contiguous, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create


def rms_norm_kernel(ctx, resources):
    node = ctx.node
    skip = node.op_type == "SkipRMSNorm"
    first = 2 if skip else 1
    y_v = node.outputs[0]
    shape = static_shape(y_v)
    data = [node.inputs[i] for i in range(first)]
    if shape is None or not shape or any(v.dtype is None or v.dtype.to_torch() != torch.float32 for v in data):
        return Decline("needs float32 data of static shape", "dnnl")
    if any(static_shape(v) != shape or strides_of(v) != contiguous(shape) for v in data) \
            or strides_of(y_v) != contiguous(shape):
        return Decline("needs row-major inputs of the output's shape (no broadcasting)", "dnnl")
    y_dtype = y_v.dtype.to_torch() if y_v.dtype is not None else None
    both = skip and len(node.outputs) == 2
    if y_dtype not in (torch.float32, torch.bfloat16) or (y_dtype != torch.float32 and skip and not both):
        return Decline("writes float32, or bfloat16 from its own buffer (not over the sum)", "dnnl")
    d = shape[-1]
    gamma = ctx.const(first) if ctx.has_input(first) else None
    if ctx.has_input(first) and (gamma is None or not gamma.is_floating_point() or gamma.numel() != d):
        return Decline("gamma must be a float constant of the last axis' size", "dnnl")
    scale = (torch.ones(d) if gamma is None else gamma.float().reshape(d)) * math.sqrt(d)
    scale = scale.contiguous()
    rows = math.prod(shape[:-1])
    md, y_md = MemDesc.of((rows, d), torch.float32), MemDesc.of((rows, d), y_dtype)
    stat = MemDesc.of((rows,), torch.float32)
    eps = float(ctx.attr("epsilon")) * d
    lib = capi.load()
    attr = Attr()
    try:
        prim = create("rms normalisation", lambda pd: lib.layer_normalization_forward_primitive_desc_create(
            pd, lib.engine, capi.FORWARD_INFERENCE, md.handle, y_md.handle, stat.handle, eps,
            capi.USE_GLOBAL_STATS | capi.USE_SCALE, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no layer normalisation for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference layer normalisation ({prim.impl})", "dnnl")
    zeros, sums = torch.zeros(rows), torch.empty(rows)
    consts = [(capi.ARG_MEAN, Memory(stat, zeros.data_ptr())), (capi.ARG_VARIANCE, Memory(stat, sums.data_ptr())),
              (capi.ARG_SCALE, Memory(MemDesc.of((d,), torch.float32), scale.data_ptr()))]
    src_slot = Slot(capi.ARG_SRC, shape, contiguous(shape), torch.float32, md)
    out_slot = Slot(capi.ARG_DST, shape, contiguous(shape), y_dtype, y_md)
    inner = DnnlKernel(prim, [src_slot], out_slot, consts, resources, (0,), keep=(zeros, sums, scale, attr))
    sums_rows = sums.view(shape[:-1])
    return _SkipRMSNorm(inner, sums_rows, both) if skip else _RMSNorm(inner, sums_rows)


class _RMSNorm:
    """The rows' sums of squares, then the primitive."""
    writes_out = True
    reads = None

    def __init__(self, inner: DnnlKernel, sums: torch.Tensor):
        self.inner, self.sums, self.impl = inner, sums, inner.impl

    def normalise(self, x: torch.Tensor, out) -> torch.Tensor:
        torch.linalg.vector_norm(x, 2, -1, out=self.sums)
        self.sums.square_()
        return self.inner(x, out=out)

    def __call__(self, x, gamma=None, out=None):
        return self.normalise(x, out)


class _SkipRMSNorm(_RMSNorm):
    def __init__(self, inner, sums, both: bool):
        super().__init__(inner, sums)
        self.both = both

    def __call__(self, a, b, gamma=None, out=None):
        if out is None:
            y = self.inner.output.empty()
            out = (y, torch.empty_like(a)) if self.both else y
        y, s = (out[0], out[1]) if self.both else (out, out)
        torch.add(a, b, out=s)
        self.normalise(s, y)                # in place over s when the node has one output
        return (y, s) if self.both else y
