"""Emitters (``script_ir.py``): the TorchScript IR of the ops a script segment may hold.

Each writes the same computation as the op's kernel, in functional aten ops, for float32
tensors of static shape on CPU: the conv-net ops (FusedConv, max / average / global average
pooling, Concat, ChannelShuffle, the elementwise ops and chains, Relu, Softmax, Reshape,
Flatten, Identity), GELU, and Linear / LinearAct with a constant weight (as the 1x1
convolution of ``onednn_graph_linear.py``).
Anything else declines (returns None) and the node keeps its own kernel. GELU's tanh form is
written out (0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))) because the oneDNN Graph bridge
computes the erf form for ``aten::gelu(..., "tanh")``.

NaN and +-Inf come out as ONNX says (``tests/runtime/test_nan_inf.py``), so where oneDNN's
own op differs the IR says it another way: ReLU is ``elu(y, 0)`` (``onednn_graph.POST_OP_IR``:
oneDNN's relu is max(y, 0), NaN -> 0), max pooling is ``max_pool2d_with_indices``, which the
bridge leaves to torch's kernel (oneDNN's max pool gives -FLT_MAX for NaN and -inf windows),
clip is ``clamp_`` in place on the fresh result (left outside; oneDNN's clip gives the bound
for NaN),
GELU keeps +inf where the input has it (torch's and oneDNN's give NaN there), and GELU and
Exp (oneDNN's: NaN -> inf) decline when oneDNN could fuse them after a convolution, pool,
concat or product (``_after_partition``). A builder made with ``exact=False``
(``Config.fast_math``) writes oneDNN's own forms instead: ``aten::relu``, ``aten::max_pool2d``,
``aten::hardtanh``, plain GELU and Exp, all fusable. No pass logic here.
"""
from __future__ import annotations

import math

from ....ir import DType
from ....ops.conv import torch_pad_list
from .conv import conv2d_geometry
from .linear import PACKED_COPY_BYTES
from ....ops.pool import PoolGeometry, native_pool2d
from ....ops.registry import NodeContext
from .script_ir import ScriptBuilder, emitter

CHANNELS_LAST = 2          # c10::MemoryFormat::ChannelsLast, as TorchScript passes it
_GELU_TANH = math.sqrt(2.0 / math.pi)


def _float_static(ctx: NodeContext, *values) -> bool:
    """Every given value (default: all inputs and outputs) is a float32 tensor of static shape.
    (bfloat16 stays out: the bridge's bf16 partitions ran 5x slower than ideep's kernels and
    handed oneDNN-layout tensors to ops that cannot read them; ``benchmarks/RESULTS.md``.)"""
    vs = values or [v for v in ctx.node.inputs if v is not None] + list(ctx.node.outputs)
    return all(v.dtype == DType.FLOAT and v.shape is not None and all(isinstance(d, int) for d in v.shape)
               for v in vs)


def relu(b: ScriptBuilder, y: str) -> str:
    """ReLU that keeps NaN when oneDNN fuses it (``onednn_graph.RELU_IR``); oneDNN's own when
    the builder need not be exact."""
    if not b.exact:
        return b.op("aten::relu", y)
    return b.op("aten::elu", y, b.float(0.0), b.float(1.0), b.float(1.0))


# ops oneDNN Graph makes a partition of, and the ones it fuses after them as post-ops (as
# ``segments.ANCHORS`` / ``POST_OPS``; Linear's IR ends in a permute and a
# reshape, which the bridge leaves outside, so nothing after it joins its partition)
_ANCHOR_OPS = {"FusedConv", "AveragePool", "GlobalAveragePool", "Concat"}
_POST_OPS = {"Relu", "Add", "Sub", "Mul", "Div", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg",
             "Erf", "Reciprocal", "ElementwiseChain"}


def _after_partition(ctx: NodeContext) -> bool:
    """Whether an input of the node may come out of a oneDNN partition through fused post-ops
    (an op oneDNN computes differently on NaN / Inf must then not join them)."""
    todo, seen = list(ctx.node.inputs), set()
    while todo:
        v = todo.pop()
        p = None if v is None else v.producer
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        if p.op_type in _ANCHOR_OPS:
            return True
        if p.op_type in _POST_OPS:
            todo += list(p.inputs)
    return False


def activation(b: ScriptBuilder, y: str, name: str, params: list[float]) -> str | None:
    """IR of ``name(y)`` (FusedConv / LinearAct activation names), or None when unknown."""
    simple = {"sigmoid": "aten::sigmoid", "tanh": "aten::tanh",
              "hardswish": "aten::hardswish", "hardsigmoid": "aten::hardsigmoid"}
    if name in ("", "none"):
        return y
    if name == "relu":
        return relu(b, y)
    if name in simple:
        return b.op(simple[name], y)
    if name in ("swish", "silu"):
        return b.op("aten::mul", y, b.op("aten::sigmoid", y))
    if name == "leaky_relu" and len(params) >= 1:
        return b.op("aten::leaky_relu", y, b.float(params[0]))
    if name == "hardtanh" and len(params) >= 2 and not b.exact:
        return b.op("aten::hardtanh", y, b.float(params[0]), b.float(params[1]))
    if name == "gelu" and not b.exact:
        return b.op("aten::gelu", y, b.str("none"))
    if name == "hardtanh" and len(params) >= 2:   # in place on the fresh result: one op, NaN kept
        return b.op("aten::clamp_", y, b.float(params[0]), b.float(params[1]))
    if name == "gelu":     # torch's erf form gives NaN for +inf: that position keeps its +inf
        g = b.op("aten::gelu", y, b.str("none"))
        return b.op("aten::where", b.op("aten::isposinf", y), y, g)
    if name == "gelu_tanh":
        cube = b.op("aten::mul", b.op("aten::mul", y, y), y)
        inner = b.op("aten::add", y, b.op("aten::mul", cube, b.float(0.044715)), b.int(1))
        t = b.op("aten::tanh", b.op("aten::mul", inner, b.float(_GELU_TANH)))
        return b.op("aten::mul", b.op("aten::mul", y, b.float(0.5)), b.op("aten::add", t, b.float(1.0), b.int(1)))
    return None


def _valid_params(params) -> bool:
    return all(math.isfinite(p) for p in params)


@emitter("fusegraph", "FusedConv")
def _fused_conv(ctx: NodeContext, b: ScriptBuilder, args):
    w = ctx.const(1)
    params = [float(p) for p in ctx.attr("activation_params", [])]
    if w is None or w.dim() != 4 or not _float_static(ctx) or not _valid_params(params):
        return None
    if ctx.attr("activation", "") == "gelu" and b.exact:      # a post-op of the convolution: +inf -> NaN
        return None
    s, begin, end, d, group = conv2d_geometry(ctx, w)
    if min(begin + end) < 0:
        return None
    x = args[0]
    if ctx.node.outputs[0].layout == "nhwc" and x in b.inputs:
        # a segment input (the network's NCHW input, say): read channels-last, a no-op when it
        # already is. Never between two ops of the segment: oneDNN Graph may hand over its own
        # blocked layout there, which an aten op in between cannot read.
        x = b.op("aten::contiguous", x, b.int(CHANNELS_LAST))
    if begin != end:
        x = b.op("aten::constant_pad_nd", x, b.ints(torch_pad_list(begin, end)), b.float(0.0))
        begin = [0, 0]
    bias = args[2] if ctx.has_input(2) else b.none()
    y = b.op("aten::conv2d", x, args[1], bias, b.ints(s), b.ints(begin), b.ints(d), b.int(group))
    if ctx.has_input(3):
        y = b.op("aten::add", y, args[3], b.int(1))
    y = activation(b, y, str(ctx.attr("activation", "")), params)
    return None if y is None else [y]


@emitter("", "MaxPool", "AveragePool")
def _pool(ctx: NodeContext, b: ScriptBuilder, args):
    if ctx.n_outputs != 1 or not _float_static(ctx):
        return None
    kind = "max" if ctx.node.op_type == "MaxPool" else "avg"
    geo = PoolGeometry(ctx)
    native = native_pool2d(ctx, geo, kind)
    if native is None:
        return None
    pad, ceil = native
    k, s = b.ints(geo.kernel), b.ints(geo.strides)
    if kind == "max" and not b.exact:
        return [b.op("aten::max_pool2d", args[0], k, s, b.ints(pad), b.ints(geo.dil), b.bool(ceil))]
    if kind == "max":       # torch's kernel: the bridge takes aten::max_pool2d (NaN -> -FLT_MAX)
        return b.op_n("aten::max_pool2d_with_indices", 2, args[0], k, s, b.ints(pad), b.ints(geo.dil),
                      b.bool(ceil))[:1]
    include = bool(ctx.attr("count_include_pad", 0))
    return [b.op("aten::avg_pool2d", args[0], k, s, b.ints(pad), b.bool(ceil), b.bool(include), b.none())]


@emitter("", "GlobalAveragePool")
def _global_average_pool(ctx: NodeContext, b: ScriptBuilder, args):
    if not _float_static(ctx) or len(ctx.shape(0)) != 4:
        return None
    return [b.op("aten::adaptive_avg_pool2d", args[0], b.ints([1, 1]))]


@emitter("", "Concat")
def _concat(ctx: NodeContext, b: ScriptBuilder, args):
    if None in args or not _float_static(ctx):
        return None
    axis = int(ctx.attr("axis"))
    return [b.op("aten::cat", b.tensor_list(list(args)), b.int(axis))]


@emitter("fusegraph", "ChannelShuffle")
def _channel_shuffle(ctx: NodeContext, b: ScriptBuilder, args):
    if not _float_static(ctx) or len(ctx.shape(0)) != 4:
        return None
    return [b.op("aten::native_channel_shuffle", args[0], b.int(ctx.attr("groups")))]


_UNARY = {"Relu": "aten::elu", "Sigmoid": "aten::sigmoid", "Tanh": "aten::tanh", "Exp": "aten::exp",
          "Log": "aten::log", "Sqrt": "aten::sqrt", "Neg": "aten::neg", "Abs": "aten::abs", "Erf": "aten::erf",
          "Reciprocal": "aten::reciprocal"}
_BINARY = {"Add": "aten::add", "Sub": "aten::sub", "Mul": "aten::mul", "Div": "aten::div",
           "Max": "aten::maximum", "Min": "aten::minimum", "Pow": "aten::pow"}


def _unary(b: ScriptBuilder, op: str, x: str) -> str:
    return relu(b, x) if op == "Relu" else b.op(_UNARY[op], x)


def _binary(b: ScriptBuilder, op: str, x: str, y: str) -> str:
    if op in ("Add", "Sub"):
        return b.op(_BINARY[op], x, y, b.int(1))
    return b.op(_BINARY[op], x, y)


@emitter("", *_UNARY)
def _unary_op(ctx: NodeContext, b: ScriptBuilder, args):
    if ctx.n_inputs != 1 or not _float_static(ctx):
        return None
    if ctx.node.op_type == "Exp" and b.exact and _after_partition(ctx):    # oneDNN's exp post-op: NaN -> inf
        return None
    return [_unary(b, ctx.node.op_type, args[0])]


@emitter("", "Add", "Sub", "Mul", "Div")
def _binary_op(ctx: NodeContext, b: ScriptBuilder, args):
    if ctx.n_inputs != 2 or None in args or "broadcast" in ctx.node.attrs or not _float_static(ctx):
        return None
    return [_binary(b, ctx.node.op_type, args[0], args[1])]


@emitter("fusegraph", "ElementwiseChain")
def _chain(ctx: NodeContext, b: ScriptBuilder, args):
    if None in args or not _float_static(ctx):
        return None
    if b.exact and any(str(step).split()[0] == "Exp" for step in ctx.attr("steps")) and _after_partition(ctx):
        return None
    p = None
    for step in ctx.attr("steps"):
        op, *operands = str(step).split()
        names = [p if a == "p" else args[int(a[1:])] for a in operands]
        if None in names or not ((op in _UNARY and len(names) == 1) or (op in _BINARY and len(names) == 2)):
            return None
        p = _unary(b, op, names[0]) if op in _UNARY else _binary(b, op, names[0], names[1])
    return None if p is None else [p]


@emitter("", "Softmax")
def _softmax(ctx: NodeContext, b: ScriptBuilder, args):
    if not _float_static(ctx):
        return None
    rank = len(ctx.shape(0))
    axis = int(ctx.attr("axis", -1 if ctx.version >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    if ctx.version < 13 and axis != rank - 1:     # the old form flattens from ``axis`` first
        return None
    return [b.op("aten::softmax", args[0], b.int(axis), b.none())]


@emitter("", "Reshape", "Flatten")
def _reshape(ctx: NodeContext, b: ScriptBuilder, args):
    if ctx.node.op_type == "Reshape" and ctx.version >= 5 and ctx.const(1) is None:
        return None
    if not _float_static(ctx, ctx.node.inputs[0], ctx.node.outputs[0]):
        return None
    return [b.op("aten::reshape", args[0], b.ints(ctx.node.outputs[0].shape))]


@emitter("", "Identity", "Dropout")
def _identity(ctx: NodeContext, b: ScriptBuilder, args):
    if ctx.n_outputs != 1 or ctx.n_inputs < 1 or not _float_static(ctx, ctx.node.inputs[0]):
        return None
    if ctx.node.op_type == "Dropout" and (ctx.n_inputs > 1 or ctx.attr("is_test", 1) == 0):
        return None            # a ratio / training_mode input: leave it to the kernel's checks
    return [args[0]]


def _as_conv1x1(ctx: NodeContext, b: ScriptBuilder, args, activation_name: str):
    """``act(x @ w^T + b)`` for a constant ``w`` [N, K] (``trans_b``) or [K, N]: the 1x1
    convolution of ``onednn_graph_linear.py`` over the rows of ``x``, or None."""
    w = ctx.const(1)
    if (w is None or w.dim() != 2 or not _float_static(ctx) or w.device.type != "cpu"
            or w.numel() * w.element_size() > PACKED_COPY_BYTES):
        return None        # (a larger weight keeps its kernel: no reordered copy of it)
    if not int(ctx.attr("trans_b", 0)):
        w = w.t()
    xs, ys = ctx.shape(0), ctx.node.outputs[0].shape
    n, k = w.shape
    rows = math.prod(xs[:-1])
    if rows == 0 or xs[-1] != k:
        return None
    x = b.op("aten::permute", b.op("aten::reshape", args[0], b.ints([1, 1, rows, k])), b.ints([0, 3, 1, 2]))
    bias = args[2] if ctx.has_input(2) else b.none()
    one, zero = b.ints([1, 1]), b.ints([0, 0])
    y = b.op("aten::conv2d", x, b.constant(w.reshape(n, k, 1, 1).contiguous()), bias, one, zero, one, b.int(1))
    late = activation_name == "gelu"      # a post-op of the product: +inf -> NaN; after the reshape
    y = activation(b, y, "none" if late else activation_name, [])
    if y is None:
        return None
    y = b.op("aten::reshape", b.op("aten::permute", y, b.ints([0, 2, 3, 1])), b.ints(ys))
    return [activation(b, y, activation_name, []) if late else y]


@emitter("fusegraph", "LinearAct")
def _linear_act(ctx: NodeContext, b: ScriptBuilder, args):
    return _as_conv1x1(ctx, b, args, str(ctx.attr("activation")))


@emitter("fusegraph", "Linear")
def _linear(ctx: NodeContext, b: ScriptBuilder, args):
    return _as_conv1x1(ctx, b, args, "none")


@emitter("", "Gelu")
@emitter("fusegraph", "Gelu")
def _gelu(ctx: NodeContext, b: ScriptBuilder, args):
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh") or not _float_static(ctx) or (ctx.n_inputs > 1 and args[1] is None):
        return None
    if approx == "none" and b.exact and _after_partition(ctx):   # oneDNN's GELU post-op: +inf -> NaN
        return None
    x = b.op("aten::add", args[0], args[1], b.int(1)) if ctx.n_inputs > 1 else args[0]
    return [activation(b, x, "gelu" if approx == "none" else "gelu_tanh", [])]
