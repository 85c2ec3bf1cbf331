"""``fusegraph::LayerNorm`` / ``fusegraph::SkipLayerNorm`` as oneDNN layer normalisation over
the last axis, and ``fusegraph::ChannelLayerNorm`` over the channel axis of channels-last data
(each pixel's channels one contiguous row), into the planned output.

SkipLayerNorm's sum ``s = a + b`` is written first (into its own output when the node gives
the residual stream as a second output, else into the normalised output's bytes, which the
primitive then normalises in place), then normalised with ``gamma`` / ``beta`` as the
primitive's scale and shift. Exact (as the op's own kernel, ``ops/norm.layer_norm_exact``):
when the result holds a NaN or an infinity, or a value normalised is so large that its row's
float32 sum of squares may overflow (``OVERFLOW_RISK``: oneDNN's variance of such a row is
infinite and the row comes out as ``beta``, finite), the node is computed again by the op's
own kernel from its inputs, which recomputes such rows in float64; a row with a NaN in it
stays NaN. One sum and one ``aminmax`` of the data decide. The fast form
(``exact`` off: a guarded node whose rows cannot overflow, ``cpu/finite.py``, or
``Config.fast_math``) skips that check. Float32 data with static shapes, the normalised axis
last and every tensor row-major; the normalised output float32, or bfloat16 (``out_dtype``: a
Cast folded in, ``passes/fold_casts.py``; oneDNN rounds once) where it has its own bytes.
"""
from __future__ import annotations

import math

import torch

from ...protocol import Decline
from ..guard import extremes
from . import capi
from .call import DnnlKernel, Slot
from .layouts import channels_last, contiguous, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create


def layer_norm_kernel(ctx, opdef, resources, exact: bool = True):
    node = ctx.node
    skip = node.op_type == "SkipLayerNorm"
    over_channels = node.op_type == "ChannelLayerNorm"
    first = 2 if skip else 1                       # gamma, beta follow the data inputs
    x_v, y_v = node.inputs[0], node.outputs[0]
    shape = static_shape(y_v)
    if shape is None or x_v.dtype is None or x_v.dtype.to_torch() != torch.float32:
        return Decline("needs float32 data of static shape", "dnnl")
    data = [node.inputs[i] for i in range(first)]
    rows_of = channels_last if over_channels else contiguous   # the normalised axis innermost
    strides = rows_of(shape)
    if over_channels and (len(shape) < 3 or strides_of(x_v) != strides or strides_of(y_v) != strides):
        return Decline("needs channels-last data (NCHW channels are not one row; the layout pass "
                       "left this graph NCHW)", "dnnl")
    if any(static_shape(v) != shape or strides_of(v) != strides for v in data) or strides_of(y_v) != strides:
        return Decline("needs row-major inputs of the output's shape (no broadcasting)", "dnnl")
    y_dtype = y_v.dtype.to_torch() if y_v.dtype is not None else None
    both = skip and len(node.outputs) == 2
    if y_dtype not in (torch.float32, torch.bfloat16) or (y_dtype != torch.float32 and skip and not both):
        return Decline("writes float32, or bfloat16 from its own buffer (not over the sum)", "dnnl")
    d = shape[1] if over_channels else shape[-1]
    consts = scale_and_shift(ctx, first, d)
    if isinstance(consts, Decline):
        return consts
    gamma, beta = consts
    rows = (math.prod(shape) // d, d)
    md, y_md = MemDesc.of(rows, torch.float32), MemDesc.of(rows, y_dtype)
    stat = MemDesc.of((d,), torch.float32)
    flags = (capi.USE_SCALE if gamma is not None else 0) | (capi.USE_SHIFT if beta is not None else 0)
    eps = float(ctx.attr("epsilon"))
    lib = capi.load()
    attr = Attr()
    try:
        prim = create("layer_normalization", lambda pd: lib.layer_normalization_forward_primitive_desc_create(
            pd, lib.engine, capi.FORWARD_INFERENCE, md.handle, y_md.handle, None, eps, flags, attr.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no layer normalisation for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference layer normalisation ({prim.impl})", "dnnl")
    params = [(capi.ARG_SCALE, Memory(stat, gamma.data_ptr())) if gamma is not None else None,
              (capi.ARG_SHIFT, Memory(stat, beta.data_ptr())) if beta is not None else None]
    portable = opdef.build(ctx) if exact else None
    risk = math.sqrt(torch.finfo(torch.float32).max / d) / 2
    src_slot = Slot(capi.ARG_SRC, shape, strides, torch.float32, md)
    out_slot = Slot(capi.ARG_DST, shape, strides, y_dtype, y_md)
    keep = tuple(t for t in (gamma, beta) if t is not None)
    inner = DnnlKernel(prim, [src_slot], out_slot, [p for p in params if p is not None], resources, (0,),
                       keep=keep)
    return _SkipLayerNorm(inner, portable, risk, both) if skip else _LayerNorm(inner, portable, risk)


def scale_and_shift(ctx, first: int, d: int) -> list | Decline:
    """Inputs ``first`` and ``first + 1`` (gamma, beta) as contiguous float32 vectors of ``d``
    (None where the node has no such input), or a ``Decline`` where one is not a float32
    constant of that size."""
    consts = []
    for i in (first, first + 1):
        t = ctx.const(i) if ctx.has_input(i) else None
        if ctx.has_input(i) and (t is None or t.dtype != torch.float32 or t.numel() != d):
            return Decline("gamma and beta must be float32 constants of the last axis' size", "dnnl")
        consts.append(None if t is None else t.reshape(d).contiguous())
    return consts


class _LayerNorm:
    """The primitive, then the exactness check (the op's kernel recomputes a non-finite result;
    none in the fast form, ``portable`` None)."""
    writes_out = True
    reads = None

    def __init__(self, inner: DnnlKernel, portable, risk: float):
        self.inner, self.portable, self.impl = inner, portable, inner.impl
        self.risk = risk          # the magnitude from which a row's float32 sum of squares may overflow

    def _at_risk(self, data: torch.Tensor) -> bool:
        """Whether the data normalised holds a value of ``risk`` or more (NaN: the result's
        sum decides)."""
        if self.portable is None:
            return False
        lo, hi = extremes(data)
        return max(-lo, hi) >= self.risk

    def _exact(self, y, args, first: bool = False, risky: bool = False):
        """``first``: the op's kernel returns (y, s); y is its first output."""
        if self.portable is not None and (risky or not math.isfinite(float(y.sum()))):
            got = self.portable(*args)
            y.copy_(got[0] if first else got)

    def __call__(self, x, gamma=None, beta=None, out=None):
        risky = self._at_risk(x)
        y = self.inner(x, out=out)
        self._exact(y, (x, gamma, beta), risky=risky)
        return y


class _SkipLayerNorm(_LayerNorm):
    def __init__(self, inner, portable, risk: float, both: bool):
        super().__init__(inner, portable, risk)
        self.both = both

    def __call__(self, a, b, gamma=None, beta=None, out=None):
        if out is None:
            y = self.inner.output.empty()
            out = (y, torch.empty_like(a)) if self.both else y
        y, s = (out[0], out[1]) if self.both else (out, out)
        torch.add(a, b, out=s)
        risky = self._at_risk(s)            # before the norm overwrites s (one output)
        self.inner(s, out=y)                # in place over s when the node has one output
        self._exact(y, (a, b, gamma, beta), first=self.both, risky=risky)
        return (y, s) if self.both else y
