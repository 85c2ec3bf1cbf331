"""Script segments (runtime/backends/cpu/segments.py, script_ops.py): which runs of nodes become
one TorchScript graph, that every emitter computes what onnxruntime (ORT_DISABLE_ALL) and the
node-by-node run compute, that a segment the bridge fails on or computes wrongly is split or
dropped (never run), and that the nodes inside a segment never compile partitions of their own."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import TensorProto

import fusegraph as fg
from fusegraph.runtime.backends.cpu import onednn_graph, script_ir
from fusegraph.runtime.backends import Deferred
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from passes_util import F, const, feeds_for, model, node  # noqa: E402

pytestmark = pytest.mark.skipif(not onednn_graph.AVAILABLE, reason="this torch has no oneDNN Graph bridge")


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def convnet(hw=12, dynamic=False):
    """Convolutions (one with asymmetric pads), pools, a concat, a channel shuffle, elementwise
    ops, a residual add, global pooling, a Gemm head and a softmax: every emitter but LinearAct's
    activations (tested below) takes part."""
    c = 16
    nodes = [node("Conv", ["x", "w0", "b0"], "a0", pads=[1, 1, 1, 1]), node("Relu", ["a0"], "r0"),
             node("Conv", ["r0", "w1", "b1"], "a1", pads=[0, 0, 1, 1], kernel_shape=[2, 2]),
             node("Sigmoid", ["a1"], "s1"), node("Mul", ["a1", "s1"], "m1"),
             node("MaxPool", ["m1"], "p1", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             node("AveragePool", ["r0"], "p0", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             node("Concat", ["p1", "p0"], "cat", axis=1),
             node("Reshape", ["cat", "s5"], "g5"), node("Transpose", ["g5"], "t5", perm=[0, 2, 1, 3, 4]),
             node("Reshape", ["t5", "s4"], "sh"),
             node("Conv", ["sh", "w2", "b2"], "a2", pads=[1, 1, 1, 1], group=2),
             node("Add", ["a2", "sh"], "res"), node("Tanh", ["res"], "tr"),
             node("Sub", ["tr", "k"], "d0"), node("Div", ["d0", "k2"], "d1"),
             node("GlobalAveragePool", ["d1"], "gap"), node("Flatten", ["gap"], "flat"),
             node("Gemm", ["flat", "wg", "bg"], "logits", transB=1), node("Softmax", ["logits"], "y", axis=1)]
    inits = [const("w0", rnd(c, 3, 3, 3, scale=0.3)), const("b0", rnd(c, seed=1, scale=0.1)),
             const("w1", rnd(c, c, 2, 2, seed=2, scale=0.2)), const("b1", rnd(c, seed=3, scale=0.1)),
             const("w2", rnd(2 * c, c, 3, 3, seed=4, scale=0.1)), const("b2", rnd(2 * c, seed=5, scale=0.1)),
             const("s5", [1, 2, c, hw // 2, hw // 2], np.int64), const("s4", [1, 2 * c, hw // 2, hw // 2], np.int64),
             const("k", rnd(2 * c, 1, 1, seed=6)), const("k2", np.abs(rnd(2 * c, 1, 1, seed=7)) + 0.5),
             const("wg", rnd(10, 2 * c, seed=8, scale=0.3)), const("bg", rnd(10, seed=9))]
    shape = ["N", 3, hw, hw] if dynamic else [1, 3, hw, hw]
    return model(nodes, [("x", F, shape)], ["y", "logits"], inits, opset=17)


def segments(compiled):
    return compiled.report.segments


def test_a_convnet_runs_as_one_segment_and_matches_onnxruntime():
    m = convnet()
    feeds = feeds_for(m, seed=3)
    compiled = fg.compile(m)
    segs = segments(compiled)
    assert [s["nodes"] for s in segs] == [compiled.report.kernel_count] and segs[0]["partitions"] >= 4
    assert compiled.report.python_calls == 1 and "ScriptSegment" in compiled.source
    got = compiled.run(feeds)
    assert_outputs_close(got, ort_run(m, feeds))
    assert_outputs_close(got, fg.compile(m, fg.Config(script_segments=False)).run(feeds))
    again = compiled.run(feeds)
    assert all(np.array_equal(got[k], again[k]) for k in got)


def test_nodes_inside_a_segment_compile_no_partition_of_their_own():
    compiled = fg.compile(convnet())
    inside = {id(n) for s in compiled._executor.code.lowered.calls if hasattr(s.node, "nodes")
              for n in s.node.nodes}
    deferred = [c.kernel for c in compiled._executor.binding.calls
                if id(c.node) in inside and isinstance(c.kernel, Deferred)]
    assert deferred and all(k._resolved is None for k in deferred)


@pytest.mark.parametrize("config", [dict(script_segments=False), dict(level="O0")])
def test_switched_off_or_unoptimised_runs_node_by_node(config):
    compiled = fg.compile(convnet(), fg.Config(**config))
    assert segments(compiled) == [] and "ScriptSegment" not in compiled.source


def test_dynamic_input_shapes_run_node_by_node():
    m = convnet(dynamic=True)
    compiled = fg.compile(m)
    assert segments(compiled) == []
    feeds = feeds_for(m, seed=1, dims={"N": 1})
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh", "Gelu", "GeluTanh"])
def test_linear_heads_in_a_segment(activation):
    """Gemm + activation (LinearAct as a 1x1 convolution inside the segment), GELU's tanh form
    written out: same numbers as onnxruntime."""
    act = {"Gelu": node("Gelu", ["h"], "y"), "GeluTanh": node("Gelu", ["h"], "y", approximate="tanh")}.get(
        activation, node(activation, ["h"], "y"))
    nodes = [node("Conv", ["x", "w0", "b0"], "a", pads=[1] * 4), node("Relu", ["a"], "r"),
             node("GlobalAveragePool", ["r"], "g"), node("Flatten", ["g"], "f"),
             node("Gemm", ["f", "wg", "bg"], "h", transB=1), act]
    inits = [const("w0", rnd(24, 3, 3, 3, scale=0.3)), const("b0", rnd(24, seed=1)),
             const("wg", rnd(40, 24, seed=2, scale=0.5)), const("bg", rnd(40, seed=3))]
    m = model(nodes, [("x", F, [1, 3, 8, 8])], ["y"], inits, opset=20)
    feeds = feeds_for(m, seed=4)
    compiled = fg.compile(m)
    ops = [n.op_type for n in compiled.graph.nodes]
    assert {"Linear", "LinearAct"} & set(ops) and [s["nodes"] for s in segments(compiled)] == [len(ops)]
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))


def test_a_segment_that_computes_otherwise_is_dropped(monkeypatch):
    """An emitter that writes the wrong op (a channel shuffle negated): the probe check drops
    every segment holding it, and the nodes keep their kernels — the outputs stay right."""
    real = script_ir.EMITTERS[("fusegraph", "ChannelShuffle")]

    def wrong(ctx, b, args):
        got = real(ctx, b, args)
        return None if got is None else [b.op("aten::neg", got[0])]
    monkeypatch.setitem(script_ir.EMITTERS, ("fusegraph", "ChannelShuffle"), wrong)
    m = convnet()
    feeds = feeds_for(m, seed=3)
    compiled = fg.compile(m)
    dropped = compiled.report.segments_dropped
    assert dropped and all("differs from the per-node kernels" in d["reason"] for d in dropped)
    inside = [n for s in compiled._executor.code.lowered.calls if hasattr(s.node, "nodes") for n in s.node.nodes]
    assert inside and "ChannelShuffle" not in [n.op_type for n in inside]
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))


def test_a_segment_the_bridge_cannot_compile_is_split(monkeypatch):
    """An emitter whose IR TorchScript rejects: the run is retried in halves, and the halves
    without that node become segments."""
    def broken(ctx, b, args):
        return [b.op("aten::no_such_op", args[0])]
    monkeypatch.setitem(script_ir.EMITTERS, ("", "Concat"), broken)
    m = convnet()
    feeds = feeds_for(m, seed=3)
    compiled = fg.compile(m)
    assert compiled.report.segments_dropped and len(segments(compiled)) >= 2
    inside = [n for s in compiled._executor.code.lowered.calls if hasattr(s.node, "nodes") for n in s.node.nodes]
    assert "Concat" not in [n.op_type for n in inside]
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))


def test_an_input_in_other_strides_still_computes_right():
    """The compiled graph is specialised on its inputs' strides; a caller's non-contiguous
    array (made contiguous by the feed conversion) or any layout gives the same numbers."""
    m = convnet()
    compiled = fg.compile(m)
    x = rnd(1, 12, 12, 3, seed=5).transpose(0, 3, 1, 2)      # an NHWC array viewed as NCHW
    want = ort_run(m, {"x": np.ascontiguousarray(x)})
    assert_outputs_close(compiled.run({"x": x}), want)
    assert_outputs_close(compiled.run({"x": torch.from_numpy(x)}), want)


def test_another_thread_count_compiles_its_own_copy():
    """Run at another intra-op thread count than the one bound for: the segment compiles a copy
    for it (from zeros of the probe's layouts) and gives the same numbers."""
    m = convnet()
    feeds = feeds_for(m, seed=3)
    compiled = fg.compile(m)
    want = compiled.run(feeds)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        got = compiled.run(feeds)
    finally:
        torch.set_num_threads(threads)
    seg = next(c for c in compiled._executor.code.lowered.calls if hasattr(c.node, "nodes"))
    assert len(seg.kernel._fns) == 2
    assert_outputs_close(got, want)


def test_a_model_that_fails_on_random_inputs_runs_node_by_node():
    """The probe runs on random floats and zero integers; a graph one of whose kernels rejects
    them (an integer division by a zero divisor) keeps every node's own kernel, says why, and
    runs on real data."""
    nodes = [node("Conv", ["x", "w0", "b0"], "a", pads=[1] * 4), node("Relu", ["a"], "r"),
             node("Sigmoid", ["r"], "y"), node("Div", ["n", "d"], "y2")]
    inits = [const("w0", rnd(4, 3, 3, 3, scale=0.3)), const("b0", rnd(4, seed=1))]
    m = model(nodes, [("x", F, [1, 3, 4, 4]), ("n", TensorProto.INT64, [2]), ("d", TensorProto.INT64, [2])],
              ["y", "y2"], inits)
    compiled = fg.compile(m)
    assert segments(compiled) == [] and "probe run" in compiled.report.segments_dropped[0]["reason"]
    feeds = {"x": rnd(1, 3, 4, 4, seed=2), "n": np.array([7, -9], np.int64), "d": np.array([2, 4], np.int64)}
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))
