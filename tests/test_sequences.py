"""Sequences and optionals against onnxruntime (ORT_DISABLE_ALL), compiled and through the .fgm
artifact: construct / insert / erase / at / length, SplitToSequence, ConcatFromSequence, a Loop
that grows a sequence, Optional*; sequence feeds and outputs; the planner leaves them out of
the arena."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import InputError
from oracle import assert_same_as, check_compiled_and_loaded, ort_run

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "seq", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    # (no onnx.checker: it wants a shape on every tensor output; onnxruntime loads these)
    return m


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name + "_v"))


def _seq_info(name, elem=F):
    return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None)))


def _check(model, feeds, tmp_path):
    return check_compiled_and_loaded(model, feeds, tmp_path / "m.fgm")[0]


def test_construct_insert_erase_at_length(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["rx"]),
             helper.make_node("SequenceConstruct", ["rx", "y", "x"], ["s0"]),
             _const("p0", np.int64(1)), _const("pm", np.int64(-1)),
             helper.make_node("SequenceInsert", ["s0", "y", "p0"], ["s1"]),
             helper.make_node("SequenceErase", ["s1", "pm"], ["s2"]),
             helper.make_node("SequenceLength", ["s2"], ["n"]),
             helper.make_node("SequenceAt", ["s2", "pm"], ["last"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
             helper.make_node("ConcatFromSequence", ["s2"], ["stacked"], axis=-1, new_axis=1)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("y", F, [2, 3])],
               [_seq_info("s2"), helper.make_tensor_value_info("n", I64, []),
                helper.make_tensor_value_info("last", F, None), helper.make_tensor_value_info("cat", F, None),
                helper.make_tensor_value_info("stacked", F, None)])
    rng = np.random.default_rng(0)
    compiled = _check(m, {"x": rng.standard_normal((2, 3)).astype(np.float32),
                          "y": rng.standard_normal((2, 3)).astype(np.float32)}, tmp_path)
    unplannable = {e["name"]: e["reason"] for e in compiled.report.memory.unplannable}
    assert "sequence" in unplannable["s2"]


@pytest.mark.parametrize("split,keepdims", [(None, 1), (None, 0), (2, 1), ([1, 3], 1)])
def test_split_to_sequence(tmp_path, split, keepdims):
    nodes, ins = [], ["x"]
    if split is not None:
        nodes.append(_const("split", np.int64(split)))
        ins.append("split")
    nodes += [helper.make_node("SplitToSequence", ins, ["s"], axis=1, keepdims=keepdims),
              helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1, new_axis=0 if keepdims else 1)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 4])],
               [_seq_info("s"), helper.make_tensor_value_info("y", F, None)])
    _check(m, {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, tmp_path)


def test_loop_grows_a_sequence(tmp_path):
    """SequenceEmpty, then a Loop body that inserts x * i each iteration; concatenated after."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["s_in", "xi"], ["s_out"])],
        "grow", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
                 _seq_info("s_in")],
        [helper.make_tensor_value_info("c_out", B, []), _seq_info("s_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["n", "", "empty"], ["s"], body=body),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)]
    m = _model(nodes, [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, None), _seq_info("s")])
    _check(m, {"n": np.array(4), "x": np.float32([1.5, -2])}, tmp_path)


def test_sequence_feed_and_optionals(tmp_path):
    opt = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2]))
    nodes = [helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=0),
             helper.make_node("Optional", ["x"], ["ox"], type=helper.make_tensor_type_proto(F, [2])),
             helper.make_node("OptionalHasElement", ["ox"], ["has"]),
             helper.make_node("OptionalGetElement", ["ox"], ["gx"]),
             helper.make_node("Optional", [], ["none"], type=helper.make_tensor_type_proto(F, [2])),
             helper.make_node("OptionalHasElement", ["none"], ["has_none"])]
    m = _model(nodes, [_seq_info("seq"), helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("cat", F, None),
                helper.make_tensor_value_info("has", B, []), helper.make_tensor_value_info("gx", F, [2]),
                helper.make_value_info("none", opt), helper.make_tensor_value_info("has_none", B, [])])
    seq = [np.float32([[1, 2]]), np.float32([[3, 4], [5, 6]])]
    feeds = {"seq": seq, "x": np.float32([7, 8])}
    want = ort_run(m, feeds)
    got = fg.compile(m).run(feeds)
    assert got["none"] is None and want["none"] is None
    for k in ("n", "cat", "has", "gx", "has_none"):
        assert_same_as(got[k], want[k], k)
    with pytest.raises(InputError, match="sequence"):
        fg.compile(m).run({"seq": np.float32([1]), "x": np.float32([7, 8])})


def test_sequence_at_out_of_range_names_the_node():
    from fusegraph.errors import KernelError
    nodes = [helper.make_node("SequenceConstruct", ["x"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"], name="pick")]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("p", I64, [])],
               [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(KernelError, match="pick"):
        fg.compile(m).run({"x": np.float32([1, 2]), "p": np.array(3)})
