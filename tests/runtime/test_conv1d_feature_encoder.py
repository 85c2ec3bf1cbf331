"""Speech encoders' 1-D convolutions on oneDNN: a wav2vec2-style feature encoder as PyTorch
exports it at opset 17 (``Unsqueeze``, ``Conv`` k10 s5 without bias, ``GroupNorm(C, C)`` as
``Reshape -> InstanceNormalization -> Reshape -> Mul -> Add``, GELU in its Erf form, strided
``Conv`` k3 s2 / k2 s2, ``Transpose`` to ``[N, L, C]``), its positional convolution (grouped,
k8, pads 4, the last frame sliced off), and HuBERT's variant (each conv followed by
``Transpose -> LayerNormalization -> Transpose``).

Checked: every 1-D convolution (the grouped one too) runs a oneDNN jit / brgemm kernel on
channels-last ``[N, C, L]`` data (not ``gemm``, not portable); the group norm is one
``GroupNorm`` node (its oneDNN decline says why: no group normalisation in oneDNN 3.2) and the
layer norms ``ChannelLayerNorm`` on oneDNN; groups of several channels (``G < C``) on NCHW and
channels-last data; the numbers of onnxruntime ORT_DISABLE_ALL and of the unoptimised graph
at rtol 1e-4, He-scaled random weights."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegraph as fg
from cpu_isa import needs_avx512
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, check, const, model, node, ops  # noqa: E402

C = 32


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


class Net:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def init(self, base, value, dtype=np.float32):
        self.n += 1
        self.inits.append(const(f"{base}{self.n}", value, dtype))
        return f"{base}{self.n}"

    def op(self, op, ins, **attrs):
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(node(op, ins, out, **attrs))
        return out

    def conv1d(self, x, c_in, c_out, k, stride=1, pads=0, group=1, bias=False):
        w = self.init("w", rnd(c_out, c_in // group, k, seed=self.n, scale=math.sqrt(2.0 / (c_in // group * k))))
        ins = [x, w] + ([self.init("b", rnd(c_out, seed=self.n, scale=0.1))] if bias else [])
        return self.op("Conv", ins, kernel_shape=[k], strides=[stride], pads=[pads, pads], group=group)

    def gelu(self, x):
        d = self.op("Div", [x, self.init("sqrt2", np.float32(math.sqrt(2.0)))])
        a = self.op("Add", [self.op("Erf", [d]), self.init("one", np.float32(1.0))])
        return self.op("Mul", [self.op("Mul", [x, a]), self.init("half", np.float32(0.5))])

    def group_norm(self, x, c, groups, rank=3):
        """PyTorch's GroupNorm export: Reshape [N, G, -1], InstanceNormalization, Reshape back,
        per-channel Mul and Add."""
        split = self.op("Reshape", [x, self.init("split", [0, groups, -1], np.int64)])
        norm = self.op("InstanceNormalization", [split, self.init("ones", np.ones(groups)),
                                                 self.init("zeros", np.zeros(groups))], epsilon=1e-5)
        back = self.op("Reshape", [norm, self.op("Shape", [x])])
        per_channel = (c,) + (1,) * (rank - 2)
        scaled = self.op("Mul", [back, self.init("gamma", 1 + rnd(*per_channel, seed=self.n, scale=0.2))])
        return self.op("Add", [scaled, self.init("beta", rnd(*per_channel, seed=self.n, scale=0.2))])

    def channels_layer_norm(self, x, c):
        t = self.op("Transpose", [x], perm=[0, 2, 1])
        ln = self.op("LayerNormalization", [t, self.init("g", 1 + rnd(c, seed=self.n, scale=0.1)),
                                            self.init("beta", rnd(c, seed=self.n, scale=0.1))], axis=-1, epsilon=1e-5)
        return self.op("Transpose", [ln], perm=[0, 2, 1])


def feature_encoder(norm="group", groups=C, length=400):
    net = Net()
    x = net.op("Unsqueeze", ["x", net.init("axis", [1], np.int64)])
    layers = [(10, 5), (3, 2), (3, 2), (2, 2)]
    c_in = 1
    for i, (k, s) in enumerate(layers):
        x = net.conv1d(x, c_in, C, k, s, bias=norm == "layer")
        if norm == "layer":
            x = net.channels_layer_norm(x, C)
        elif i == 0:
            x = net.group_norm(x, C, groups)
        x = net.gelu(x)
        c_in = C
    seq = net.op("Transpose", [x], perm=[0, 2, 1])                  # [N, L, C]
    # the positional convolution: grouped, k8, pads 4, the last frame sliced off, GELU, residual
    pos = net.conv1d(net.op("Transpose", [seq], perm=[0, 2, 1]), C, C, 8, pads=4, group=4, bias=True)
    frames = _frames(length, layers)
    pos = net.op("Slice", [pos, net.init("st", [0], np.int64), net.init("en", [frames], np.int64),
                           net.init("ax", [2], np.int64)])
    y = net.op("Add", [seq, net.op("Transpose", [net.gelu(pos)], perm=[0, 2, 1])])
    net.nodes.append(node("Identity", [y], "y"))
    return model(net.nodes, [("x", F, [1, length])], ["y"], net.inits, opset=17)


def _frames(length, layers):
    for k, s in layers:
        length = (length - k) // s + 1
    return length


def impls(compiled, op):
    return [getattr(c.kernel, "impl", None) or "portable" for c in compiled._executor.binding.calls
            if c.node.op_type == op]


def fast(impl: str) -> bool:
    return impl.startswith(("jit", "brg")) and "gemm" not in impl


@pytest.mark.parametrize("norm", ["group", "layer"])
def test_feature_encoder_forms_fuse(norm):
    c = check(feature_encoder(norm), oracle="ort")
    got = ops(c)
    assert got.count("FusedConv") == 5 and "Conv" not in got
    if norm == "group":
        assert got.count("GroupNorm") == 1 and "InstanceNormalization" not in got
    else:
        assert got.count("ChannelLayerNorm") == 4 and "LayerNormalization" not in got
    convs = [n for n in c.graph.nodes if n.op_type == "FusedConv"]
    assert all(n.outputs[0].layout == "nhwc" for n in convs)         # [N, C, L] stored channels-last


@needs_avx512
@pytest.mark.parametrize("norm", ["group", "layer"])
def test_feature_encoder_kernels(norm):
    c = check(feature_encoder(norm), oracle="ort", feeds={"x": rnd(1, 400, seed=5)})
    convs = impls(c, "FusedConv")
    assert len(convs) == 5 and all(fast(i) for i in convs), convs
    declined = c.report.kernels["declined"]
    assert not [d for d in declined if d["op"] == "FusedConv"]
    if norm == "layer":
        assert all(fast(i) for i in impls(c, "ChannelLayerNorm"))
    else:
        assert [d["reason"] for d in declined if d["op"] == "GroupNorm"] == \
            ["oneDNN 3.2 has no group normalisation; its batch normalisation over one sample is slower "
             "than the op's own kernel (one reduction, one multiply-add)"]


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("convs", [0, 2])
def test_group_norm_of_channel_groups(rank, convs):
    """G < C: on NCHW data (no convolution: F.group_norm) and on channels-last data (after two
    convolutions: one reduction over the rows, one multiply-add into the planned layout)."""
    net = Net()
    shape = [1, C] + [12] * (rank - 2)
    x = "x"
    for _ in range(convs):
        w = net.init("w", rnd(C, C, *([3] * (rank - 2)), seed=net.n, scale=math.sqrt(2.0 / (C * 3 ** (rank - 2)))))
        x = net.op("Conv", [x, w], pads=[1] * (2 * (rank - 2)))
    y = net.group_norm(x, C, 8, rank)
    net.nodes.append(node("Identity", [y], "y"))
    c = check(model(net.nodes, [("x", F, shape)], ["y"], net.inits, opset=17), oracle="ort")
    (gn,) = [n for n in c.graph.nodes if n.op_type == "GroupNorm"]
    assert gn.attrs["groups"] == 8
    assert gn.inputs[0].layout == ("nhwc" if convs else "nchw")


def test_instance_norm_alone_is_a_group_norm_of_single_channels():
    net = Net()
    x = net.conv1d(net.conv1d("x", C, C, 3, pads=1), C, C, 3, pads=1)
    y = net.op("InstanceNormalization", [x, net.init("s", 1 + rnd(C, scale=0.2)), net.init("b", rnd(C, seed=1))])
    net.nodes.append(node("Identity", [y], "y"))
    c = check(model(net.nodes, [("x", F, [1, C, 50])], ["y"], net.inits, opset=17), oracle="ort")
    (gn,) = [n for n in c.graph.nodes if n.op_type == "GroupNorm"]
    assert gn.attrs["groups"] == C


def test_loaded_artifact_runs_the_same(tmp_path):
    """The 1-D convolutions' packed weights (stored as 3-D weights seen as 4-D) reload."""
    m = feature_encoder("group")
    feeds = {"x": rnd(1, 400, seed=2)}
    compiled = fg.compile(m)
    compiled.save(tmp_path / "enc.fgm")
    loaded = fg.load(tmp_path / "enc.fgm")
    want = ort_run(m, feeds)
    assert_outputs_close(compiled.run(feeds), want)
    assert_outputs_close(loaded.run(feeds), want)


@needs_avx512
def test_channel_layer_norm_checks_channels_last_data_for_overflow():
    """The exact channel layer norm's overflow check reads channels-last data as it lies: a
    position whose values may overflow its float32 sum of squares is computed again in float64,
    a position holding a NaN stays NaN, the rest are the float64 norm's."""
    import torch
    c = fg.compile(feature_encoder("layer"), fg.Config(threads=1))
    call = next(k for k in c._executor.binding.calls if k.node.op_type == "ChannelLayerNorm")
    assert fast(call.kernel.impl)
    # a guarded node (the bounds admit its fast form at a run's usual magnitudes): its exact
    # kernel is the one a run brings such a position to
    exact = call.kernel.exact if hasattr(call.kernel, "exact") else call.kernel
    gamma, beta = (call.node.inputs[i].const.reshape(-1).double() for i in (1, 2))
    length = call.node.outputs[0].shape[2]
    x = torch.from_numpy(rnd(1, length, C, seed=9)).transpose(1, 2)      # [N, C, L], each position's channels one row
    x[0, :, 3] = torch.linspace(-4e19, 4e19, C)                          # its sum of squares overflows float32
    x[0, 5, 7] = float("nan")
    with torch.inference_mode():
        y = exact(x, *(call.node.inputs[i].const for i in (1, 2)),
                  out=torch.empty(1, length, C).transpose(1, 2))
    xd = x.double()
    want = (xd - xd.mean(1, keepdim=True)) / torch.sqrt(xd.var(1, unbiased=False, keepdim=True) + call.node.attrs["epsilon"])
    want = want * gamma[None, :, None] + beta[None, :, None]
    assert torch.isnan(y[0, :, 7]).all() and not torch.isnan(y[0, :, [3, 6, 8]]).any()
    keep = [i for i in range(length) if i != 7]
    torch.testing.assert_close(y[0][:, keep].double(), want[0][:, keep], rtol=1e-4, atol=1e-4)
