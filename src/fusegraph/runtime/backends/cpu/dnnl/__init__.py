"""oneDNN primitives called directly (ctypes, no compiler, no TorchScript): kernels that write
into the planned arena, hold their weights once in the blocked layout they run on, and cost
a few microseconds a call.

``DnnlKernels.kernel(ctx, opdef, key, exact)`` gives a node's kernel (``conv.py``: FusedConv;
``conv_int8.py`` / ``linear_int8.py``: the int8 QConv / QLinear, ``int8_float.py`` these,
QMatMul and QLinearDynamic in float32 where the CPU's int8 kernels do not sum exactly; ``matmul_int8.py``: QMatMul
(an int8 product of two activations); ``linear_dynamic_int8.py``:
QLinearDynamic (an int8 product of an activation quantised at run time);
``linear.py``: LinearAct / Linear (``linear_runtime.py`` where the rows are known at run time only); ``pool.py``: max / average / global pools; ``lrn.py``;
``shuffle.py``: ChannelShuffle; ``resample.py``: a bilinear Resize; ``quantize.py``: per-tensor QuantizeLinear to uint8,
DequantizeLinear, DynamicQuantizeLinear, Requantize and QAdd of static shape; ``layernorm.py``: LayerNorm, SkipLayerNorm, ChannelLayerNorm
(``layernorm_runtime.py``: LayerNorm, SkipLayerNorm whose rows are known at run time only);
GroupNorm declines (``GROUP_NORM_DECLINE``); ``rmsnorm.py``: RMSNorm, SkipRMSNorm; ``binary.py``:
ElementwiseChain of per-channel affine steps; ``attention.py``: ScaledDotProductAttention;
``concat.py``: bfloat16 Concat; ``softmax.py``: Softmax; ``eltwise.py``: a standalone Gelu's fast form; ``gated.py``:
a GatedActivation's GELU (over rows by ``rows_eltwise.py``, as after sgemm in ``linear_runtime.py``); ``gated_linear.py``:
GatedLinear, its gating in two products' epilogues; ``rotary.py``: RotaryEmbedding with constant
tables; ``rnn.py``: RNN, GRU and
fusegraph::LSTM, one recurrent primitive per node), a
``Decline`` with the reason when it has the family but not this node, or None for an op it has
no family for. The quantised ops' kernels are made only for a node their op's own checks
take (``_refused_by_op``). ``available()``: whether the library loads here
(``capi.UNAVAILABLE`` says why not).
"""
from __future__ import annotations

from .....errors import UnsupportedOpError
from ...protocol import Decline
from . import capi
from .attention import attention_kernel
from .binary import chain_kernel
from .concat import concat_kernel
from .conv import conv_kernel
from .conv_int8 import conv_int8_kernel
from .eltwise import gelu_kernel
from .gated import gated_kernel
from .gated_linear import gated_linear_kernel
from .int8_float import float_qconv_kernel, float_qlinear_dynamic_kernel, float_qlinear_kernel, float_qmatmul_kernel
from .int8_support import int8_exact
from .layouts import static_shape
from .linear import linear_kernel
from .linear_dynamic_int8 import linear_dynamic_int8_kernel
from .linear_int8 import linear_int8_kernel
from .matmul_int8 import qmatmul_kernel
from .linear_runtime import runtime_linear_kernel
from .layernorm import layer_norm_kernel
from .layernorm_runtime import runtime_layer_norm_kernel
from .lrn import lrn_kernel
from .pool import pool_kernel
from .quantize import dequantize_kernel, dynamic_quantize_kernel, qadd_kernel, quantize_kernel, requantize_kernel
from .resample import resize_kernel
from .rmsnorm import rms_norm_kernel
from .rotary import rotary_kernel
from .rnn import rnn_kernel
from .shuffle import shuffle_kernel
from .softmax import softmax_kernel
from .primitive import Resources
from .weights import WeightStore


def available() -> bool:
    return capi.load() is not None


def unavailable_reason() -> str:
    capi.load()
    return capi.UNAVAILABLE or "oneDNN is available"


# oneDNN 3.2 (the wheel's) has no group normalisation primitive (3.3 added one); its batch
# normalisation computing the statistics of one channels-last sample is the same arithmetic
# for groups of one channel, but measured slower than the op's own kernel (benchmarks/RESULTS.md)
GROUP_NORM_DECLINE = ("oneDNN 3.2 has no group normalisation; its batch normalisation over one sample "
                      "is slower than the op's own kernel (one reduction, one multiply-add)")
QUANTISED_OPS = {("fusegraph", "QConv"), ("fusegraph", "QLinear"), ("fusegraph", "QMatMul")}
INTEGER_PRODUCTS = {("", "MatMulInteger"), ("", "ConvInteger"), ("", "QLinearMatMul"), ("", "QLinearConv")}
INTEGER_PRODUCT_DECLINE = ("an integer product the int8 rewrites did not take (their declines say why: passes "
                           "dynamic_quant and qlinear_ops in report.passes / report.fusions): its reference kernel runs")
POOLS = {("", "MaxPool"), ("", "AveragePool"), ("", "GlobalAveragePool"), ("", "GlobalMaxPool")}
RECURRENT = {("", "RNN"), ("", "GRU"), ("", "LSTM"), ("fusegraph", "LSTM")}


def _unfused_conv(ctx) -> str:
    """Why a plain Conv reached the backend (``conv_prepack`` makes FusedConvs of the rest)."""
    x = ctx.node.inputs[0]
    rank = len(x.shape) if x.shape is not None else None
    if rank not in (3, 4):
        return f"a convolution of input rank {rank}: this backend has oneDNN kernels for 1-D and 2-D ones"
    if ctx.const(1) is None:
        return "weights computed at run time: oneDNN kernels here prepack constant weights"
    return "not made a FusedConv by the fusion pass (see report.fusions, rule conv_prepack)"


class DnnlKernels:
    def __init__(self, store: WeightStore):
        self.store = store
        self.resources = Resources()
        self.one_row_steps = False     # the model being bound runs mostly one row (a decoder's steps)

    def kernel(self, ctx, opdef, key, exact: bool):
        if key == ("fusegraph", "FusedConv"):
            return conv_kernel(ctx, self.store, self.resources, exact)
        if key in (("fusegraph", "LinearAct"), ("fusegraph", "Linear")):
            if static_shape(ctx.node.inputs[0]) is None:       # rows known at run time only
                return runtime_linear_kernel(ctx, self.store, self.resources, exact, self.one_row_steps)
            return linear_kernel(ctx, self.store, self.resources, exact)
        if key in QUANTISED_OPS and (why := _refused_by_op(ctx, opdef)) is not None:
            return why
        if key == ("fusegraph", "QConv"):
            if not int8_exact():        # float32 kernels between quantising reorders
                return float_qconv_kernel(ctx, self.resources, self.store)
            return conv_int8_kernel(ctx, self.store, self.resources)
        if key == ("fusegraph", "QLinear"):
            if not int8_exact():
                return float_qlinear_kernel(ctx, self.resources, self.store)
            return linear_int8_kernel(ctx, self.store, self.resources)
        if key == ("fusegraph", "QMatMul"):
            if not int8_exact():
                return float_qmatmul_kernel(ctx, self.resources)
            return qmatmul_kernel(ctx, self.resources)
        if key == ("fusegraph", "QLinearDynamic"):
            if not int8_exact():
                return float_qlinear_dynamic_kernel(ctx, self.resources, self.store)
            return linear_dynamic_int8_kernel(ctx, self.store, self.resources)
        if key in POOLS:
            return pool_kernel(ctx, opdef, self.resources, exact)
        if key == ("", "LRN"):
            return lrn_kernel(ctx, self.resources)
        if key == ("", "Resize"):
            return resize_kernel(ctx, self.resources)
        if key == ("fusegraph", "ChannelShuffle"):
            return shuffle_kernel(ctx, self.resources)
        if key == ("", "QuantizeLinear"):
            return quantize_kernel(ctx, self.resources)
        if key == ("", "DequantizeLinear"):
            return dequantize_kernel(ctx, self.resources)
        if key == ("", "DynamicQuantizeLinear"):
            return dynamic_quantize_kernel(ctx, opdef, self.resources)
        if key == ("fusegraph", "Requantize"):
            return requantize_kernel(ctx, self.resources)
        if key == ("fusegraph", "QAdd"):
            return qadd_kernel(ctx, self.resources)
        if key in (("fusegraph", "LayerNorm"), ("fusegraph", "SkipLayerNorm")) \
                and static_shape(ctx.node.outputs[0]) is None:     # rows known at run time only
            return runtime_layer_norm_kernel(ctx, opdef, self.resources, exact)
        if key in (("fusegraph", "LayerNorm"), ("fusegraph", "SkipLayerNorm"), ("fusegraph", "ChannelLayerNorm")):
            return layer_norm_kernel(ctx, opdef, self.resources, exact)
        if key in (("fusegraph", "RMSNorm"), ("fusegraph", "SkipRMSNorm")):
            return rms_norm_kernel(ctx, self.resources)
        if key in INTEGER_PRODUCTS:             # one the int8 rewrites did not take
            return Decline(INTEGER_PRODUCT_DECLINE, "dnnl")
        if key == ("", "Conv"):                 # one the fusion pass did not make a FusedConv
            return Decline(_unfused_conv(ctx), "dnnl")
        if key == ("fusegraph", "GroupNorm"):
            return Decline(GROUP_NORM_DECLINE, "dnnl")
        if key == ("fusegraph", "ElementwiseChain"):
            return chain_kernel(ctx, self.resources, exact)
        if key == ("fusegraph", "ScaledDotProductAttention"):
            return attention_kernel(ctx, self.resources)
        if key == ("", "Concat"):
            return concat_kernel(ctx, self.resources)
        if key == ("", "Softmax"):
            return softmax_kernel(ctx, opdef, self.resources, exact)
        if key in (("", "Gelu"), ("fusegraph", "Gelu")):
            return gelu_kernel(ctx, self.resources, exact)
        if key == ("fusegraph", "GatedActivation"):
            return gated_kernel(ctx, self.resources, exact)
        if key == ("fusegraph", "GatedLinear"):
            return gated_linear_kernel(ctx, self.store, self.resources, exact)
        if key == ("fusegraph", "RotaryEmbedding"):
            return rotary_kernel(ctx, self.resources)
        if key in RECURRENT:
            return rnn_kernel(ctx, self.store, self.resources, exact)
        return None


def _refused_by_op(ctx, opdef) -> Decline | None:
    """The op's own checks of its attributes, run before an int8 kernel is made: a kernel takes
    no node its op refuses (an attribute of a re-sealed artifact that the kernel would not
    read); the op's kernel then refuses it with the reason."""
    try:
        opdef.build(ctx)
    except UnsupportedOpError as exc:
        return Decline(str(exc), "dnnl")
    return None
