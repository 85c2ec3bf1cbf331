"""A ConvNeXt stage as ``transformers`` exports it (opset 17): the patchify stem and the
downsampling layer with a "channels_first" LayerNorm (``Transpose(0, 2, 3, 1) ->
LayerNormalization -> Transpose(0, 3, 1, 2)``), and blocks of a 7x7 depthwise convolution,
``Transpose`` to channels-last, LayerNorm, MatMul + Add, GELU (the Erf form), MatMul + Add,
layer scale (``Mul`` by a per-channel vector), ``Transpose`` back and the residual ``Add``.

Checked: the channels-first norms become ``ChannelLayerNorm`` (no transposes); the layer
scale folds into the second product (``layer_scale``: no Mul left); the blocks' transposes sink
through their norm and products until they cancel (``rules_channels_last``): each block is a
depthwise convolution, a channel layer norm and two pointwise convolutions, the residual Add
folded into the last; every convolution (the depthwise 7x7 included) and every norm runs a
oneDNN jit / brgemm kernel on channels-last data, and the numbers equal onnxruntime
ORT_DISABLE_ALL's and the unoptimised graph's at rtol 1e-4 (He-scaled weights)."""
import math

import numpy as np
import pytest

from cpu_isa import needs_avx512
from passes_util import F, check, const, model, node, ops

C = 32
TO_LAST, FROM_LAST = [0, 2, 3, 1], [0, 3, 1, 2]


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def he(*shape, seed=0, fan_in=None):
    fan_in = fan_in or int(np.prod(shape[1:]))
    return rnd(*shape, seed=seed, scale=math.sqrt(2.0 / fan_in))


class Net:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return f"{base}{self.n}"

    def init(self, base, value):
        name = self.name(base)
        self.inits.append(const(name, value))
        return name

    def op(self, op, ins, **attrs):
        out = self.name(op.lower())
        self.nodes.append(node(op, ins, out, **attrs))
        return out

    def conv(self, x, c_in, c_out, k, stride=1, pads=0, group=1):
        w = self.init("w", he(c_out, c_in // group, k, k, seed=self.n))
        b = self.init("b", rnd(c_out, seed=self.n, scale=0.1))
        return self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride] * 2, pads=[pads] * 4, group=group)

    def layer_norm(self, x, c):
        g = self.init("g", 1 + rnd(c, seed=self.n, scale=0.1))
        b = self.init("beta", rnd(c, seed=self.n + 50, scale=0.1))
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-6)

    def channels_first_norm(self, x, c):
        t = self.op("Transpose", [x], perm=TO_LAST)
        return self.op("Transpose", [self.layer_norm(t, c)], perm=FROM_LAST)

    def linear(self, x, k, n):
        w = self.init("lw", he(n, k, seed=self.n).T.copy())
        return self.op("Add", [self.op("MatMul", [x, w]), self.init("lb", rnd(n, seed=self.n, scale=0.1))])

    def gelu(self, x):
        d = self.op("Div", [x, self.init("sqrt2", np.float32(math.sqrt(2.0)))])
        a = self.op("Add", [self.op("Erf", [d]), self.init("one", np.float32(1.0))])
        return self.op("Mul", [self.op("Mul", [x, a]), self.init("half", np.float32(0.5))])

    def block(self, x, c):
        h = self.conv(x, c, c, 7, pads=3, group=c)
        h = self.layer_norm(self.op("Transpose", [h], perm=TO_LAST), c)
        h = self.linear(self.gelu(self.linear(h, c, 4 * c)), 4 * c, c)
        h = self.op("Mul", [h, self.init("gamma", rnd(c, seed=self.n, scale=0.5))])     # layer scale
        return self.op("Add", [x, self.op("Transpose", [h], perm=FROM_LAST)])


def convnext(size=32):
    net = Net()
    x = net.channels_first_norm(net.conv("x", 3, C, 4, stride=4), C)       # stem
    x = net.block(x, C)
    x = net.conv(net.channels_first_norm(x, C), C, 2 * C, 2, stride=2)       # downsampling layer
    x = net.block(x, 2 * C)
    net.nodes.append(node("Identity", [x], "y"))
    return model(net.nodes, [("x", F, [1, 3, size, size])], ["y"], net.inits, opset=17)


def kernels(compiled, op):
    return [getattr(c.kernel, "impl", None) or "portable" for c in compiled._executor.binding.calls
            if c.node.op_type == op]


def test_convnext_forms_fuse():
    c = check(convnext(), oracle="ort")
    assert sorted(ops(c)) == ["ChannelLayerNorm"] * 4 + ["FusedConv"] * 8
    convs = [n for n in c.graph.nodes if n.op_type == "FusedConv"]
    assert all(n.outputs[0].layout == "nhwc" for n in convs)
    assert sum(n.attrs.get("group", 1) > 1 for n in convs) == 2                        # the 7x7 depthwise
    assert [n.attrs["activation"] for n in convs if n.attrs["kernel_shape"] == [1, 1]] == ["gelu", "", "gelu", ""]
    assert sum(len(n.inputs) > 3 and n.inputs[3] is not None for n in convs) == 2        # the residuals
    applied = {f.rule for f in c.report.fusions if f.applied}
    assert {"channel_layer_norm", "layer_scale", "sink_transpose_norm", "sink_transpose_linear",
            "transpose_pair", "conv_add"} <= applied


def test_a_transpose_read_twice_stays():
    """The transposed value read by the norm and by a graph output: nothing sinks."""
    net = Net()
    t = net.op("Transpose", [net.conv(net.conv("x", 3, C, 3, pads=1), C, C, 3, pads=1)], perm=TO_LAST)
    y = net.op("Transpose", [net.linear(net.layer_norm(t, C), C, C)], perm=FROM_LAST)
    net.nodes.append(node("Identity", [y], "y"))
    m = model(net.nodes, [("x", F, [1, 3, 6, 6])], ["y", t], net.inits, opset=17)
    c = check(m, oracle="ort")
    assert ops(c).count("Transpose") == 2 and "ChannelLayerNorm" not in ops(c)


@needs_avx512
def test_convnext_kernels_are_oneDNN_jit_or_brgemm():
    c = check(convnext(), oracle="ort", feeds={"x": rnd(1, 3, 32, 32, seed=3)})
    for op in ("FusedConv", "ChannelLayerNorm"):
        got = kernels(c, op)
        assert got and all(i.startswith(("jit", "brg", "brdgmm")) and "gemm" not in i for i in got), (op, got)


def test_channel_layer_norm_declines_other_permutations():
    net = Net()
    x = net.conv(net.conv("x", 3, C, 3, pads=1), C, C, 3, pads=1)
    t = net.op("Transpose", [x], perm=[0, 3, 2, 1])                    # W and C swapped: not a channel move
    y = net.op("Transpose", [net.layer_norm(t, C)], perm=[0, 3, 2, 1])
    net.nodes.append(node("Identity", [y], "y"))
    c = check(model(net.nodes, [("x", F, [1, 3, 8, C])], ["y"], net.inits, opset=17), oracle="ort")
    assert "ChannelLayerNorm" not in ops(c)
    assert "the transposes do not move the channel axis last and back" in \
        [f.reason for f in c.report.fusions if f.rule == "channel_layer_norm" and not f.applied]


@pytest.mark.parametrize("gamma_shape, folds", [((C,), True), ((1, 1, 1, C), True), ((1, 1, 4, C), False)])
def test_layer_scale_folds_only_a_vector_along_the_features(gamma_shape, folds):
    net = Net()
    h = net.linear(net.op("Transpose", [net.conv("x", 3, C, 3, pads=1)], perm=TO_LAST), C, C)
    y = net.op("Mul", [h, net.init("gamma", rnd(*gamma_shape, seed=9))])
    net.nodes.append(node("Identity", [y], "y"))
    c = check(model(net.nodes, [("x", F, [1, 3, 4, 4])], ["y"], net.inits, opset=17), oracle="ort")
    assert ("Mul" not in ops(c)) == folds
    if not folds:
        assert "the scale is not a constant vector along the output features" in \
            [f.reason for f in c.report.fusions if f.rule == "layer_scale" and not f.applied]
