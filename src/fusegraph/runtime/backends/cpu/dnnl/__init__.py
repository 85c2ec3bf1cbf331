"""oneDNN primitives called directly (ctypes, no compiler, no TorchScript): kernels that write
into the planned arena, hold their weights once in the blocked layout they run on, and cost
a few microseconds a call.

``DnnlKernels.kernel(ctx, opdef, key, exact)`` gives a node's kernel (``conv.py``: FusedConv;
``conv_int8.py`` / ``linear_int8.py``: the int8 QConv / QLinear;
``linear.py``: LinearAct / Linear (``linear_runtime.py`` where the rows are known at run time only); ``pool.py``: max / average / global pools; ``lrn.py``;
``shuffle.py``: ChannelShuffle; ``layernorm.py``: LayerNorm, SkipLayerNorm; ``binary.py``:
ElementwiseChain of per-channel affine steps; ``attention.py``: ScaledDotProductAttention;
``concat.py``: bfloat16 Concat; ``softmax.py``: Softmax), a
``Decline`` with the reason when it has the family but not this node, or None for an op it has
no family for. ``available()``: whether the library loads here (``capi.UNAVAILABLE`` says why
not).
"""
from __future__ import annotations

from . import capi
from .attention import attention_kernel
from .binary import chain_kernel
from .concat import concat_kernel
from .conv import conv_kernel
from .conv_int8 import conv_int8_kernel
from .layouts import static_shape
from .linear import linear_kernel
from .linear_int8 import linear_int8_kernel
from .linear_runtime import runtime_linear_kernel
from .layernorm import layer_norm_kernel
from .lrn import lrn_kernel
from .pool import pool_kernel
from .shuffle import shuffle_kernel
from .softmax import softmax_kernel
from .primitive import Resources
from .weights import WeightStore


def available() -> bool:
    return capi.load() is not None


def unavailable_reason() -> str:
    capi.load()
    return capi.UNAVAILABLE or "oneDNN is available"


POOLS = {("", "MaxPool"), ("", "AveragePool"), ("", "GlobalAveragePool"), ("", "GlobalMaxPool")}


class DnnlKernels:
    def __init__(self, store: WeightStore):
        self.store = store
        self.resources = Resources()

    def kernel(self, ctx, opdef, key, exact: bool):
        if key == ("fusegraph", "FusedConv"):
            return conv_kernel(ctx, self.store, self.resources, exact)
        if key in (("fusegraph", "LinearAct"), ("fusegraph", "Linear")):
            if static_shape(ctx.node.inputs[0]) is None:       # rows known at run time only
                return runtime_linear_kernel(ctx, self.store, self.resources, exact)
            return linear_kernel(ctx, self.store, self.resources, exact)
        if key == ("fusegraph", "QConv"):
            return conv_int8_kernel(ctx, self.store, self.resources)
        if key == ("fusegraph", "QLinear"):
            return linear_int8_kernel(ctx, self.store, self.resources)
        if key in POOLS:
            return pool_kernel(ctx, opdef, self.resources, exact)
        if key == ("", "LRN"):
            return lrn_kernel(ctx, self.resources)
        if key == ("fusegraph", "ChannelShuffle"):
            return shuffle_kernel(ctx, self.resources)
        if key in (("fusegraph", "LayerNorm"), ("fusegraph", "SkipLayerNorm")):
            return layer_norm_kernel(ctx, opdef, self.resources, exact)
        if key == ("fusegraph", "ElementwiseChain"):
            return chain_kernel(ctx, self.resources, exact)
        if key == ("fusegraph", "ScaledDotProductAttention"):
            return attention_kernel(ctx, self.resources)
        if key == ("", "Concat"):
            return concat_kernel(ctx, self.resources)
        if key == ("", "Softmax"):
            return softmax_kernel(ctx, opdef, self.resources, exact)
        return None
