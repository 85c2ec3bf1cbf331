"""CNN fusion rules (passes/fusion/rules_cnn.py) and their kernels (ops/fused_cnn.py): each rule
graph-in / graph-out (the fused op list and attributes) and numerically against the unoptimised
graph (O0) and onnxruntime with ORT_DISABLE_ALL at fp32 rtol 1e-4, each with a case where it must
decline and the reason it records in ``report.fusions``. Two-conv chains make the layout pass
choose channels-last, so the oneDNN kernels (packed weights) are what runs."""
import numpy as np
import pytest
import torch

from fusegraph.ops import opdef_for
from fusegraph.ops.registry import NodeContext
from passes_util import F, check, compile_with, const, model, node, ops

C = 8


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def declined(compiled, rule):
    return [f.reason for f in compiled.report.fusions if f.rule == rule and not f.applied]


def fused(compiled, op="FusedConv"):
    return [n for n in compiled.graph.nodes if n.domain == "fusegraph" and n.op_type == op]


def conv_inits(k=3, seed=0, n=2, c_in=C):
    out = []
    for i in range(n):
        out += [const(f"w{i}", rnd(C, c_in if i == 0 else C, k, k, seed=seed + i, scale=0.3)),
                const(f"b{i}", rnd(C, seed=seed + 10 + i, scale=0.1))]
    return out


def act_nodes(act, src, dst, tag):
    """``dst = act(src)`` as ONNX nodes, plus their constant initializers."""
    if act == "Clip":
        return [node("Clip", [src, f"lo{tag}", f"hi{tag}"], dst)], [const(f"lo{tag}", 0.0), const(f"hi{tag}", 6.0)]
    if act == "Clip6":
        return [node("Clip", [src], dst, min=0.0, max=6.0)], []
    if act == "SiLU":
        return [node("Sigmoid", [src], f"s{tag}"), node("Mul", [src, f"s{tag}"], dst)], []
    if act == "HardSwishMul":
        return [node("HardSigmoid", [src], f"s{tag}", alpha=1 / 6), node("Mul", [f"s{tag}", src], dst)], []
    if act == "HardSigmoid":
        return [node("HardSigmoid", [src], dst, alpha=1 / 6)], []
    if act == "LeakyRelu":
        return [node("LeakyRelu", [src], dst, alpha=0.2)], []
    if act == "GeluTanh":
        return [node("Gelu", [src], dst, approximate="tanh")], []
    return [node(act, [src], dst)], []


ACTS = {"Relu": "relu", "Clip": "hardtanh", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSigmoid": "hardsigmoid",
        "HardSwish": "hardswish", "HardSwishMul": "hardswish", "SiLU": "swish", "LeakyRelu": "leaky_relu",
        "Gelu": "gelu", "GeluTanh": "gelu_tanh"}


def chain(act, shape=(1, C, 9, 9), opset=20, k=3):
    """x -> Conv -> act -> Conv -> act -> y."""
    nodes, inits = [], conv_inits(k, c_in=shape[1])
    src = "x"
    for i in range(2):
        nodes.append(node("Conv", [src, f"w{i}", f"b{i}"], f"c{i}", pads=[k // 2] * 4))
        more, ci = act_nodes(act, f"c{i}", f"a{i}", i)
        nodes += more
        inits += ci
        src = f"a{i}"
    nodes.append(node("Identity", [src], "y"))
    return model(nodes, [("x", F, list(shape))], ["y"], inits, opset=opset)


@pytest.mark.parametrize("act", sorted(ACTS))
def test_conv_activation_fuses(act):
    c = check(chain(act), oracle="ort")
    assert ops(c) == ["FusedConv", "FusedConv"]
    assert [n.attrs["activation"] for n in fused(c)] == [ACTS[act]] * 2
    assert all(n.outputs[0].layout == "nhwc" for n in fused(c))        # oneDNN, channels-last
    assert all(n.meta["rule"].startswith("conv_") for n in fused(c))
    assert any(f.applied and f.rule.startswith("conv_") for f in c.report.fusions)


def test_clip_opset6_attributes():
    c = check(chain("Clip6", opset=6), oracle="ort")
    assert [n.attrs["activation_params"] for n in fused(c)] == [[0.0, 6.0]] * 2


def test_activation_declines():
    # HardSigmoid with ONNX's default alpha 0.2 is not torch's hardsigmoid: kept apart
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4), node("HardSigmoid", ["c"], "y")]
    c = check(model(nodes, [("x", F, [1, C, 6, 6])], ["y"], conv_inits(n=1)), oracle="ort")
    assert ops(c) == ["FusedConv", "HardSigmoid"] and "alpha" in declined(c, "conv_hardsigmoid")[0]
    # Clip bounds from a graph input: not a constant
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4), node("Clip", ["c", "lo", "hi"], "y")]
    m = model(nodes, [("x", F, [1, C, 6, 6]), ("lo", F, []), ("hi", F, [])], ["y"], conv_inits(n=1))
    feeds = {"x": rnd(1, C, 6, 6), "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
    c = check(m, oracle="ort", feeds=feeds)
    assert "Clip" in ops(c) and "constant" in declined(c, "conv_clip")[0]
    # the conv output is read by another node too
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4), node("Relu", ["c"], "y")]
    c = check(model(nodes, [("x", F, [1, C, 6, 6])], ["y", "c"], conv_inits(n=1)), oracle="ort")
    assert fused(c)[0].attrs["activation"] == "" and "also read by" in declined(c, "conv_relu")[0]


@pytest.mark.parametrize("op", ["Add", "Sum"])
@pytest.mark.parametrize("act", [None, "Relu"])
def test_conv_residual_add(op, act):
    """x -> Conv(3x3) -> Relu -> Conv -> (+ x) -> act: the second conv, the add and the act are one node."""
    nodes = [node("Conv", ["x", "w0", "b0"], "c0", pads=[1] * 4), node("Relu", ["c0"], "r0"),
             node("Conv", ["r0", "w1", "b1"], "c1", pads=[1] * 4), node(op, ["x", "c1"], "s")]
    nodes += [node(act, ["s"], "y")] if act else [node("Identity", ["s"], "y")]
    for memory in ("off", "balanced"):
        c = check(model(nodes, [("x", F, [1, C, 7, 7])], ["y"], conv_inits()), oracle="ort", memory=memory)
        assert ops(c) == ["FusedConv", "FusedConv"]
        last = fused(c)[-1]
        assert len(last.inputs) == 4 and last.inputs[3].name == "x"
        assert last.attrs["activation"] == ("relu" if act else "")


def test_residual_declines_when_it_broadcasts():
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4), node("Add", ["c", "z"], "y")]
    m = model(nodes, [("x", F, [1, C, 5, 5]), ("z", F, [1, C, 1, 1])], ["y"], conv_inits(n=1))
    c = check(m, oracle="ort")
    assert ops(c) == ["FusedConv", "Add"] and "broadcasts" in declined(c, "conv_add")[0]


def test_residual_kernel_forms_are_bit_exact():
    """The oneDNN residual convolution accumulating in place onto z (a ``sum`` post-op, when the
    planner puts the output over z) and the one reading z (a ``binary add`` post-op) give the
    same bits, into any output buffer, and match the op's portable kernel."""
    from fusegraph.runtime.backends.cpu.backend import CpuBackend
    from fusegraph.runtime.backends.cpu.dnnl import available
    from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
    if not available():
        pytest.skip("the oneDNN library does not load here")
    nodes = [node("Conv", ["x", "w0", "b0"], "c0", pads=[1] * 4), node("Conv", ["c0", "w1", "b1"], "c1", pads=[1] * 4),
             node("Add", ["c1", "x"], "s"), node("Relu", ["s"], "y")]
    c = compile_with(model(nodes, [("x", F, [1, C, 7, 7])], ["y"], conv_inits()))
    n = fused(c)[-1]
    for v in (n.outputs[0], n.inputs[0], n.inputs[3]):
        v.layout = "nhwc"                 # the channels-last kernels, as under the layout pass
    kernels = []
    for inplace in (3, None):
        ctx = NodeContext(n)
        ctx.inplace_input = inplace
        kernels.append(CpuBackend().kernel(ctx, opdef_for(n)))
    summed, binary = kernels
    assert isinstance(summed, DnnlKernel) and summed.prefill is not None
    assert isinstance(binary, DnnlKernel) and binary.prefill is None
    x = torch.randn(1, C, 7, 7).contiguous(memory_format=torch.channels_last)
    z = torch.randn(1, C, 7, 7).contiguous(memory_format=torch.channels_last)
    want = binary(x, z)
    z2 = z.clone()
    assert torch.equal(summed(x, z2, out=z2), want)       # in place on the residual
    other = torch.empty_like(z)
    assert torch.equal(summed(x, z, out=other), want) and torch.equal(other, want)   # copied there first
    w, b = n.inputs[1].const, n.inputs[2].const
    torch.testing.assert_close(opdef_for(n).build(NodeContext(n))(x, w, b, z), want, rtol=1e-4, atol=1e-5)


def test_conv_bn_rule_folds_when_the_affine_passes_are_off():
    bn = [const("s", rnd(C, seed=3) ** 2 + 0.5), const("bb", rnd(C, seed=4)), const("mu", rnd(C, seed=5)),
          const("var", rnd(C, seed=6) ** 2 + 0.5)]
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4),
             node("BatchNormalization", ["c", "s", "bb", "mu", "var"], "t"), node("Relu", ["t"], "y")]
    m = model(nodes, [("x", F, [1, C, 6, 6])], ["y"], conv_inits(n=1) + bn)
    c = check(m, oracle="ort", disabled_passes=("batchnorm_to_affine",))
    assert ops(c) == ["FusedConv"] and fused(c)[0].attrs["activation"] == "relu"
    assert any(f.rule == "conv_bn" and f.applied for f in c.report.fusions)
    # default O2: batchnorm_to_affine + conv_affine_fold already fold it; nothing but the conv is left
    assert ops(check(m, oracle="ort")) == ["FusedConv"]
    # declines: the conv output is also read elsewhere
    nodes.append(node("Add", ["c", "y"], "y2"))
    m = model(nodes, [("x", F, [1, C, 6, 6])], ["y2"], conv_inits(n=1) + bn)
    c = check(m, oracle="ort", disabled_passes=("batchnorm_to_affine",))
    assert "BatchNormalization" in ops(c) and "also read by" in declined(c, "conv_bn")[0]


def test_external_and_no_fuse_stop_fusion_and_say_so():
    m = chain("Relu")
    c = check(m, oracle="ort", external_tensors=("c0",))
    assert ops(c) == ["FusedConv", "Relu", "FusedConv"]
    assert any("external" in r for r in declined(c, "conv_relu"))
    assert any(v.name == "c0" for n in c.graph.nodes for v in n.outputs)


def test_prepack_and_its_decline():
    nodes = [node("Conv", ["x", "w0", "b"], "y", pads=[1] * 4)]
    m = model(nodes, [("x", F, [1, C, 6, 6]), ("b", F, [C])], ["y"], conv_inits(n=1)[:1])
    feeds = {"x": rnd(1, C, 6, 6), "b": rnd(C, seed=1)}
    c = check(m, oracle="ort", feeds=feeds)
    assert ops(c) == ["Conv"] and "bias is not constant" in declined(c, "conv_prepack")[0]
    c = check(model(nodes[:1], [("x", F, [1, C, 6, 6])], ["y"], conv_inits(n=1)[:1] + [const("b", rnd(C))]),
              oracle="ort")
    assert ops(c) == ["FusedConv"]


@pytest.mark.parametrize("case", ["grouped_strided_asym", "dilated", "one_by_one", "dynamic_batch", "conv1d"])
def test_fused_conv_geometries(case):
    """Kernel paths: oneDNN with pre-padding, dilation, the 1x1 GEMM path, the torch fallback
    (dynamic batch, 1-D) — all against onnxruntime."""
    shape, k, attrs = [1, C, 11, 11], 3, {}
    if case == "grouped_strided_asym":
        attrs = dict(group=2, strides=[2, 2], pads=[0, 1, 1, 2])
    elif case == "dilated":
        attrs = dict(dilations=[2, 2], pads=[2, 2, 2, 2])
    elif case == "one_by_one":
        k = 1
    elif case == "dynamic_batch":
        shape, attrs = ["n", C, 11, 11], dict(pads=[1] * 4)
    else:
        shape, attrs = [1, C, 11], dict(pads=[1, 1])
    ws = [rnd(C, C // attrs.get("group", 1), *([k] * (len(shape) - 2)), seed=i, scale=0.3) for i in range(2)]
    inits = [const("w0", ws[0]), const("w1", ws[1]), const("b0", rnd(C, seed=7)), const("b1", rnd(C, seed=8))]
    nodes = [node("Conv", ["x", "w0", "b0"], "c0", **attrs), node("Relu", ["c0"], "r0"),
             node("Conv", ["r0", "w1", "b1"], "c1", **{**attrs, "strides": [1] * (len(shape) - 2),
                                                      "group": attrs.get("group", 1)}),
             node("Sigmoid", ["c1"], "y")]
    if case == "grouped_strided_asym":
        nodes[2].ClearField("attribute")
        nodes[2].attribute.extend(node("Conv", [], "_", group=2, pads=[1, 1, 1, 1]).attribute)
    m = model(nodes, [("x", F, shape)], ["y"], inits)
    c = check(m, oracle="ort")
    assert [n.attrs["activation"] for n in fused(c)] == ["relu", "sigmoid"]


def test_channel_shuffle():
    g, n = 2, C // 2
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4), node("Reshape", ["c", "s5"], "r"),
             node("Transpose", ["r"], "t", perm=[0, 2, 1, 3, 4]), node("Reshape", ["t", "s4"], "u"),
             node("Conv", ["u", "w1", "b1"], "y", pads=[1] * 4)]
    inits = conv_inits() + [const("s5", [1, g, n, 6, 6], np.int64), const("s4", [1, C, 6, 6], np.int64)]
    c = check(model(nodes, [("x", F, [1, C, 6, 6])], ["y"], inits), oracle="ort")
    assert ops(c) == ["FusedConv", "ChannelShuffle", "FusedConv"]
    assert fused(c, "ChannelShuffle")[0].attrs["groups"] == g
    nodes[2] = node("Transpose", ["r"], "t", perm=[0, 1, 2, 4, 3])   # swaps H and W: not a shuffle
    c = check(model(nodes, [("x", F, [1, C, 6, 6])], ["y"], inits), oracle="ort")
    assert "ChannelShuffle" not in ops(c) and "swap" in declined(c, "channel_shuffle")[0]


def test_inspect_fusions_lists_applied_and_declined(tmp_path, capsys):
    from fusegraph.cli.main import main
    nodes = [node("Conv", ["x", "w0", "b0"], "c", pads=[1] * 4), node("Relu", ["c"], "r"),
             node("Conv", ["r", "w1", "b1"], "d", pads=[1] * 4), node("Add", ["d", "z"], "y")]
    m = model(nodes, [("x", F, [1, C, 5, 5]), ("z", F, [1, C, 1, 1])], ["y"], conv_inits())
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    assert main(["inspect", str(path), "--fusions"]) == 0
    out = capsys.readouterr().out
    assert "fusions applied: 2" in out and "conv_relu" in out and "FusedConv" in out
    assert "fusions declined: 1" in out and "conv_add" in out and "broadcasts" in out
