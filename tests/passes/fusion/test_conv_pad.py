"""Rule ``pad_into_conv`` (passes/fusion/rules_conv_pad.py) on the depthwise-separable blocks
that ``transformers`` exports for MobileNet V1 / V2 and EfficientNet: TF "same" padding as a
``Pad(x, pads, 0.0)`` node in front of every convolution (zero pads before the 1x1 ones), at
stride 1 and 2. The Pads fold into the convolutions' asymmetric pads, the net goes
channels-last, and every convolution runs a oneDNN jit / brgemm kernel (not ``gemm``, not
portable), with the numbers of onnxruntime ORT_DISABLE_ALL and of the unoptimised graph at
rtol 1e-4 (He-scaled random weights). Each decline (reflect / edge padding, a non-zero value,
channel pads, a crop) is checked with its reason, and its numbers too."""
import math

import numpy as np
import pytest

from cpu_isa import needs_avx512
from passes_util import F, check, const, model, node, ops

C = 16


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def he(*shape, seed=0):
    fan_in = int(np.prod(shape[1:]))
    return rnd(*shape, seed=seed, scale=math.sqrt(2.0 / fan_in))


def tf_same(size, k, s):
    """(begin, end) of TensorFlow's "same" padding, as transformers' ``apply_tf_padding``."""
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def declined(compiled, rule="pad_into_conv"):
    return [f.reason for f in compiled.report.fusions if f.rule == rule and not f.applied]


def impls(compiled, op="FusedConv"):
    return [getattr(c.kernel, "impl", None) or "portable"
            for c in compiled._executor.binding.calls if c.node.op_type == op]


def fast(impl: str) -> bool:
    return (impl.startswith(("jit", "brg", "brdgmm")) or ":jit" in impl) and "gemm" not in impl


class Net:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def pad(self, src, pads, value=0.0, mode="constant"):
        i, self.n = self.n, self.n + 1
        self.inits += [const(f"pads{i}", pads, np.int64), const(f"value{i}", value)]
        self.nodes.append(node("Pad", [src, f"pads{i}", f"value{i}"], f"p{i}", mode=mode))
        return f"p{i}"

    def conv(self, src, c_in, c_out, k, stride=1, group=1, act=True):
        i, self.n = self.n, self.n + 1
        self.inits += [const(f"w{i}", he(c_out, c_in // group, k, k, seed=i)),
                       const(f"b{i}", rnd(c_out, seed=100 + i, scale=0.1))]
        self.nodes.append(node("Conv", [src, f"w{i}", f"b{i}"], f"c{i}", kernel_shape=[k, k], strides=[stride] * 2,
                               pads=[0, 0, 0, 0], group=group, dilations=[1, 1]))
        if not act:
            return f"c{i}"
        self.inits += [const(f"lo{i}", 0.0), const(f"hi{i}", 6.0)]
        self.nodes.append(node("Clip", [f"c{i}", f"lo{i}", f"hi{i}"], f"a{i}"))
        return f"a{i}"

    def separable(self, src, c_in, c_out, size, stride):
        """transformers' MobileNet layer pair: TF-padded depthwise 3x3, then a padded 1x1."""
        top, bottom = tf_same(size, 3, stride)
        x = self.pad(src, [0, 0, top, top, 0, 0, bottom, bottom])
        x = self.conv(x, c_in, c_in, 3, stride, group=c_in)
        x = self.pad(x, [0] * 8)
        return self.conv(x, c_in, c_out, 1)


def separable_net(size=14, strides=(2, 1)):
    net, x, c = Net(), "x", C
    for s in strides:
        x = net.separable(x, c, 2 * c, size, s)
        c, size = 2 * c, -(-size // s)
    net.nodes.append(node("Identity", [x], "y"))
    return model(net.nodes, [("x", F, [1, C, 14, 14])], ["y"], net.inits, opset=17)


def test_tf_same_pads_fold_into_the_convolutions():
    c = check(separable_net(), oracle="ort")
    assert "Pad" not in ops(c)
    convs = [n for n in c.graph.nodes if n.op_type == "FusedConv"]
    # 14 -> 7 at stride 2: "same" pads nothing before and one row / column after
    assert [n.attrs["pads"] for n in convs] == [[0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert all(n.outputs[0].layout == "nhwc" for n in convs)


@needs_avx512
@pytest.mark.parametrize("strides", [(2, 1), (1, 2)])
def test_depthwise_separable_blocks_run_oneDNN_fast_kernels(strides):
    c = check(separable_net(strides=strides), oracle="ort")
    got = impls(c)
    assert len(got) == 4 and all(fast(i) for i in got), got
    assert not any(d["op"] == "FusedConv" for d in c.report.kernels["declined"])


def _single(pads, value=0.0, mode="constant", shape=(1, C, 9, 9), k=3):
    """x -> Pad -> Conv -> Conv (two convolutions: the layout pass goes channels-last)."""
    net = Net()
    x = net.pad("x", pads, value, mode)
    c_in = shape[1] + pads[1] + pads[5]
    x = net.conv(x, c_in, C, k)
    x = net.conv(x, C, C, 1)
    net.nodes.append(node("Identity", [x], "y"))
    return model(net.nodes, [("x", F, list(shape))], ["y"], net.inits, opset=17)


@pytest.mark.parametrize("pads, value, mode, reason", [
    ([0, 0, 1, 1, 0, 0, 1, 1], 0.0, "reflect", "reflect padding repeats values; a convolution pads with zeros"),
    ([0, 0, 1, 1, 0, 0, 1, 1], 0.0, "edge", "edge padding repeats values; a convolution pads with zeros"),
    ([0, 0, 1, 1, 0, 0, 1, 1], 1.5, "constant", "pads with 1.5, not with zeros"),
    ([0, 2, 1, 1, 0, 0, 1, 1], 0.0, "constant", "pads the batch or channel axis"),
    ([0, 0, -1, 0, 0, 0, 1, 1], 0.0, "constant", "negative pads (a crop)"),
])
def test_declines_with_reason(pads, value, mode, reason):
    c = check(_single(pads, value, mode), oracle="ort")
    assert "Pad" in ops(c)
    assert reason in declined(c)


def test_a_pad_read_elsewhere_stays_for_that_reader():
    net = Net()
    p = net.pad("x", [0, 0, 0, 0, 0, 0, 1, 1])
    a = net.conv(p, C, C, 2)
    b = net.conv(a, C, C, 1)
    net.nodes += [node("ReduceMean", [p], "m", axes=[2, 3], keepdims=0), node("Identity", [b], "y")]
    m = model(net.nodes, [("x", F, [1, C, 9, 9])], ["y", "m"], net.inits, opset=17)
    c = check(m, oracle="ort")
    assert ops(c).count("Pad") == 1
    first = next(n for n in c.graph.nodes if n.op_type == "FusedConv")
    assert first.inputs[0].name == "x" and first.attrs["pads"] == [0, 0, 1, 1]


def test_onnx_pad_axes_input_spatial_only():
    """Pad-18's ``axes`` input naming the spatial axes (negative indices)."""
    nodes = [node("Pad", ["x", "pads", "value", "axes"], "p", mode="constant"),
             node("Conv", ["p", "w0", "b0"], "c0", kernel_shape=[3, 3]), node("Relu", ["c0"], "r0"),
             node("Conv", ["r0", "w1", "b1"], "y", kernel_shape=[1, 1])]
    inits = [const("pads", [1, 0, 0, 1], np.int64), const("value", 0.0), const("axes", [-2, -1], np.int64),
             const("w0", he(C, C, 3, 3)), const("b0", rnd(C, seed=1, scale=0.1)),
             const("w1", he(C, C, 1, 1, seed=2)), const("b1", rnd(C, seed=3, scale=0.1))]
    c = check(model(nodes, [("x", F, [1, C, 8, 8])], ["y"], inits, opset=18), oracle="ort")
    assert "Pad" not in ops(c)
    assert next(n for n in c.graph.nodes if n.op_type == "FusedConv").attrs["pads"] == [1, 0, 0, 1]
