"""A pointwise Conv over a channel Concat of upsampled maps runs at the maps' own resolution
(``passes/conv_before_resize.py``): checked against onnxruntime ORT_DISABLE_ALL and the
unoptimised graph, with the rewrite's nodes counted; the forms it must leave alone."""
import numpy as np
import pytest
from onnx import helper

from passes_util import F, I64, check, const, model, node, ops

M = 6          # output channels of the fuse conv


def _head(parts, out_channels=M, bias=True, opset=18, act="Relu"):
    """``parts``: (channels, source side, resize node kwargs or None); the output side is 16.
    Each part: x_i -> [Resize] -> Concat(axis 1) -> Conv 1x1 (+bias) -> act."""
    rng = np.random.default_rng(0)
    inputs, nodes, inits, names = [], [], [], []
    for i, (c, side, resize) in enumerate(parts):
        inputs.append((f"x{i}", F, [1, c, side, side]))
        if resize is None:
            names.append(f"x{i}")
            continue
        how = dict(resize)
        if "sizes" in how:
            inits.append(const(f"sz{i}", how.pop("sizes"), np.int64))
            ins = [f"x{i}", "", "", f"sz{i}"]
        else:
            inits.append(const(f"sc{i}", how.pop("scales")))
            ins = [f"x{i}", "", f"sc{i}"]
        nodes.append(node("Resize", ins, f"r{i}", **how))
        names.append(f"r{i}")
    total = sum(c for c, _, _ in parts)
    inits.append(const("w", rng.normal(0, (2 / total) ** 0.5, (out_channels, total, 1, 1))))
    if bias:
        inits.append(const("b", rng.normal(0, 0.5, out_channels)))
    nodes += [node("Concat", names, "cat", axis=1),
              node("Conv", ["cat", "w", "b"] if bias else ["cat", "w"], "conv", kernel_shape=[1, 1])]
    nodes.append(node(act, ["conv"], "y") if act else node("Identity", ["conv"], "y"))
    return model(nodes, inputs, ["y"], inits, opset=opset)


LINEAR4 = {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "scales": [1, 1, 4, 4]}
NEAREST2 = {"mode": "nearest", "sizes": [1, 8, 16, 16]}
CUBIC2 = {"mode": "cubic", "coordinate_transformation_mode": "align_corners", "scales": [1, 1, 2, 2]}
AXES_SIZES = {"mode": "linear", "sizes": [16, 16], "axes": [2, 3]}


def _rewritten(compiled) -> bool:
    return any(r.rule == "conv_before_resize" and r.applied for r in compiled.report.fusions)


@pytest.mark.parametrize("parts,bias", [
    ([(8, 16, None), (8, 4, LINEAR4), (8, 8, NEAREST2)], True),     # segformer's form: one part at full size
    ([(8, 4, LINEAR4), (8, 8, CUBIC2)], True),                      # every part resized: the bias added once
    ([(8, 4, LINEAR4), (8, 8, CUBIC2)], False),
    ([(10, 16, None), (8, 8, AXES_SIZES)], True),                   # sizes over the spatial axes only
])
def test_the_fuse_conv_runs_at_each_parts_resolution(parts, bias):
    m = _head(parts, bias=bias)
    compiled = check(m, level="O2", oracle="ort")
    assert _rewritten(compiled)
    assert "Concat" not in ops(compiled)
    resized = sum(r is not None for _, _, r in parts)
    assert ops(compiled).count("Resize") == resized


def test_every_rewritten_conv_reads_the_smaller_map():
    m = _head([(8, 16, None), (8, 4, LINEAR4), (8, 8, NEAREST2)], act=None)
    compiled = check(m, level="O1", oracle="ref", disabled_passes=["fusion"])
    # O1 runs no replacement: the rewrite is part of O2's replace group
    assert not _rewritten(compiled) and ops(compiled).count("Conv") == 1
    compiled = check(m, level="O2", oracle="ref", disabled_passes=["fusion", "layout"])
    graph = compiled.graph
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    assert sorted(n.inputs[0].shape[-1] for n in convs) == [4, 8, 16]
    for n in graph.nodes:
        if n.op_type == "Resize":
            assert n.inputs[0].producer.op_type == "Conv" and n.outputs[0].shape == (1, M, 16, 16)


@pytest.mark.parametrize("parts,out_channels,why", [
    ([(8, 16, None), (8, 32, {"mode": "linear", "scales": [1, 1, 0.5, 0.5]})], M, "downsampling"),
    ([(8, 16, None), (4, 4, LINEAR4)], M, "more output channels than the resized part has"),
    ([(8, 16, None), (8, 4, {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                             "scales": [1, 1, 4, 4]})], M, "tf_crop_and_resize extrapolates"),
])
def test_left_alone(parts, out_channels, why):
    m = _head(parts, out_channels=out_channels)
    if "tf_crop_and_resize" in why:      # its roi input: the whole image
        m.graph.initializer.append(const("roi", [0, 0, 0, 0, 1, 1, 1, 1]))
        for n in m.graph.node:
            if n.op_type == "Resize":
                n.input[1] = "roi"
    compiled = check(m, level="O2", oracle="ort")
    assert not _rewritten(compiled) and "Concat" in ops(compiled), why


def test_a_concatenation_read_twice_is_left_alone():
    m = _head([(8, 16, None), (8, 4, LINEAR4)])
    m.graph.node.append(node("ReduceSum", ["cat"], "s", keepdims=0))
    m.graph.output.append(helper.make_tensor_value_info("s", F, None))
    compiled = check(m, level="O2", oracle="ort", disabled_passes=["fusion"])   # the conv keeps its name
    assert not _rewritten(compiled)
    assert any(r.rule == "conv_before_resize" and not r.applied and "other users" in r.reason
               for r in compiled.report.fusions)


def test_sizes_read_at_run_time_are_left_alone():
    m = _head([(8, 16, None), (8, 8, NEAREST2)])
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "sz1"))
    m.graph.input.append(helper.make_tensor_value_info("sz1", I64, [4]))
    feeds = {"x0": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32),
             "x1": np.random.default_rng(2).standard_normal((1, 8, 8, 8)).astype(np.float32),
             "sz1": np.array([1, 8, 16, 16], np.int64)}
    compiled = check(m, level="O2", oracle="ort", feeds=feeds)
    assert not _rewritten(compiled)
