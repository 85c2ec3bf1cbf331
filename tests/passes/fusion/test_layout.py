"""The layout pass (passes/layout.py): which values become channels-last, that reorders move
past layout-agnostic ops to the layout-sensitive reader, when it declines (few convs, reorders
dominating), that planned buffers follow the choice, and that results equal the unoptimised
graph and onnxruntime (ORT_DISABLE_ALL) with and without it."""
import numpy as np
import pytest
import torch

from passes_util import F, check, const, model, node, ops

C = 8


def rnd(*shape, seed=0, scale=0.3):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _layout_stats(c):
    return [p.stats for p in c.report.passes if p.name == "layout"][-1]


def _net(tail="flatten", n_conv=3):
    """convs + relu, a max pool, a concat of two branches, an add with an NCHW input, then ``tail``."""
    inits, nodes, src = [], [], "x"
    for i in range(n_conv):
        inits += [const(f"w{i}", rnd(C, C, 3, 3, seed=i)), const(f"b{i}", rnd(C, seed=10 + i, scale=0.1))]
        nodes += [node("Conv", [src, f"w{i}", f"b{i}"], f"c{i}", pads=[1] * 4), node("Relu", [f"c{i}"], f"r{i}")]
        src = f"r{i}"
    nodes += [node("MaxPool", [src], "p", kernel_shape=[2, 2], strides=[2, 2]),
              node("Concat", ["p", "p"], "cat", axis=1)]
    if tail == "flatten":
        nodes += [node("Flatten", ["cat"], "y")]
    else:
        nodes += [node("Identity", ["cat"], "y")]
    return model(nodes, [("x", F, [1, C, 12, 12])], ["y"], inits)


def test_channels_last_through_agnostic_ops_to_the_sensitive_reader():
    c = check(_net(), oracle="ort")
    st = _layout_stats(c)
    assert st["channels_last"] and st["fused_convs"] == 3
    lay = {n.op_type: n.outputs[0].layout for n in c.graph.nodes}
    assert lay["FusedConv"] == "nhwc" and lay["MaxPool"] == "nhwc" and lay["Concat"] == "nhwc"
    assert lay["Flatten"] != "nhwc"
    # the only reorders: the graph input into the first conv, the pooled concat into Flatten
    x_bytes, cat_bytes = C * 12 * 12 * 4, 2 * C * 6 * 6 * 4
    assert st["reorder_bytes"] == 2 * x_bytes + 2 * cat_bytes


def test_planned_buffers_follow_the_layout():
    c = check(_net(tail="identity"), oracle="ort", memory="balanced")
    calls = {call.node.op_type: call for call in c._executor.binding.calls}
    cat = calls["Concat"]
    assert cat.node.outputs[0].layout == "nhwc"
    if cat.out is not None:
        assert cat.out[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("memory", ["off", "balanced", "tight"])
def test_mixed_layouts_never_share_a_buffer_in_place(memory):
    """Add(conv output [nhwc], graph input [nchw]) -> Relu: equal to the oracle in every memory mode."""
    inits = [const("w0", rnd(C, C, 3, 3)), const("b0", rnd(C, seed=1)), const("w1", rnd(C, C, 3, 3, seed=2))]
    nodes = [node("Conv", ["x", "w0", "b0"], "c0", pads=[1] * 4), node("Relu", ["c0"], "r0"),
             node("Conv", ["r0", "w1"], "c1", pads=[1] * 4), node("Relu", ["c1"], "r1"),
             node("Add", ["r1", "x"], "s"), node("Neg", ["s"], "y")]
    c = check(model(nodes, [("x", F, [1, C, 9, 9])], ["y"], inits), oracle="ort", memory=memory)
    assert ops(c).count("FusedConv") == 2


def test_declines_with_few_convs_and_when_reorders_dominate():
    c = check(_net(n_conv=1), oracle="ort")
    assert not _layout_stats(c)["channels_last"]
    assert all(v.layout == "nchw" for n in c.graph.nodes for v in n.outputs)
    # every conv output goes through a Transpose (layout-sensitive): reorders outweigh the gain
    inits, nodes, src = [], [], "x"
    for i in range(3):
        inits += [const(f"w{i}", rnd(C, C, 1, 1, seed=i))]
        nodes += [node("Conv", [src, f"w{i}"], f"c{i}"), node("Transpose", [f"c{i}"], f"t{i}", perm=[0, 1, 3, 2])]
        src = f"t{i}"
    nodes.append(node("Identity", [src], "y"))
    c = check(model(nodes, [("x", F, [1, C, 10, 10])], ["y"], inits), oracle="ort")
    assert not _layout_stats(c)["channels_last"]


def test_layout_pass_can_be_disabled():
    c = check(_net(), oracle="ort", disabled_passes=("layout",))
    assert all(v.layout == "nchw" for n in c.graph.nodes for v in n.outputs)


def _conv_implementations(c) -> dict:
    return {call.kernel.impl: call.node.name for call in c._executor.binding.calls
            if call.node.op_type == "FusedConv" and hasattr(call.kernel, "impl")}


@pytest.mark.parametrize("form", ["2d", "2d-stride-2", "1d-between-transposes"])
def test_a_depthwise_convolution_goes_channels_last_even_alone(form):
    """One depthwise convolution (+ SiLU) is the graph's only convolution: over nchw oneDNN has
    only its im2col GEMM for it, so the pass lays it out channels-last anyway (a MobileNet
    block cut out, a Conformer's depthwise 1-D convolution between two transposes)."""
    ch = 16
    if form.startswith("2d"):
        stride = 2 if form.endswith("2") else 1
        inits = [const("w", rnd(ch, 1, 3, 3, seed=1)), const("b", rnd(ch, seed=2, scale=0.1))]
        nodes = [node("Conv", ["x", "w", "b"], "c", group=ch, pads=[1] * 4, strides=[stride] * 2),
                 node("Sigmoid", ["c"], "s"), node("Mul", ["c", "s"], "y")]
        m = model(nodes, [("x", F, [1, ch, 20, 20])], ["y"], inits)
    else:
        inits = [const("w", rnd(ch, 1, 7, seed=1)), const("b", rnd(ch, seed=2, scale=0.1))]
        nodes = [node("Transpose", ["x"], "xt", perm=[0, 2, 1]),
                 node("Conv", ["xt", "w", "b"], "c", group=ch, pads=[3, 3]),
                 node("Sigmoid", ["c"], "s"), node("Mul", ["c", "s"], "a"),
                 node("Transpose", ["a"], "y", perm=[0, 2, 1])]
        m = model(nodes, [("x", F, [1, 40, ch])], ["y"], inits)
    c = check(m, oracle="ort")
    st = _layout_stats(c)
    assert st["channels_last"] and st["fused_convs"] == 1 and st["depthwise_convs"] == 1
    conv = next(n for n in c.graph.nodes if n.op_type == "FusedConv")
    assert conv.outputs[0].layout == "nhwc"
    impls = _conv_implementations(c)
    if impls:      # oneDNN loads here: its depthwise kernel, not the GEMM fallback
        assert not any("gemm" in i for i in impls), impls


def test_a_grouped_convolution_of_several_channels_a_group_is_not_forced():
    """Groups of several input channels each (AlexNet's two): nchw has its GEMM per group, the
    usual rule decides (one convolution: not worth a layout change)."""
    inits = [const("w", rnd(C, C // 2, 3, 3, seed=1))]
    m = model([node("Conv", ["x", "w"], "y", group=2, pads=[1] * 4)], [("x", F, [1, C, 10, 10])], ["y"], inits)
    c = check(m, oracle="ort")
    st = _layout_stats(c)
    assert not st["channels_last"] and st["depthwise_convs"] == 0
