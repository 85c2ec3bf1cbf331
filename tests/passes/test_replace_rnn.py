"""lstm_gate_order: an ONNX LSTM with constant weights becomes ``fusegraph::LSTM`` with its gate
blocks reordered from ``iofc`` to ``ifco``; the op's own kernel (``cpu_kernels="portable"``)
and the oneDNN one give onnxruntime's numbers, so the reorder and the new op's gate order
agree."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes_util import check, ops

sys.path.insert(0, str(Path(__file__).parents[1]))
from recurrent_models import recurrent_model  # noqa: E402


@pytest.mark.parametrize("kernels", ["portable", "auto"])
@pytest.mark.parametrize("direction,peepholes", [("forward", False), ("bidirectional", True)])
def test_lstm_becomes_fusegraph_lstm(kernels, direction, peepholes):
    model, feeds = recurrent_model("LSTM", direction=direction, peepholes=peepholes, hidden=5)
    compiled = check(model, oracle="ort", feeds=feeds, cpu_kernels=kernels)
    (lstm,) = compiled.graph.nodes
    assert (lstm.domain, lstm.op_type) == ("fusegraph", "LSTM") and lstm.meta["rule"] == "lstm_gate_order"
    assert lstm.attrs["direction"] == direction
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "W"))
    got = compiled._executor.binding.backend.portable_weight(lstm.inputs[1]).numpy()
    h = 5
    for new, old in enumerate((0, 2, 3, 1)):       # i f c o from ONNX's i o f c
        np.testing.assert_array_equal(got[:, new * h:(new + 1) * h], w[:, old * h:(old + 1) * h])


def test_bias_halves_are_both_reordered():
    """B holds Wb then Rb: each half's blocks move (a bias whose halves differ tells)."""
    model, feeds = recurrent_model("LSTM", hidden=4, seed=3)
    b = next(i for i in model.graph.initializer if i.name == "B")
    arr = numpy_helper.to_array(b).copy()
    arr[:, 16:] = np.linspace(-2, 2, 16, dtype=np.float32)
    b.CopyFrom(numpy_helper.from_array(arr, "B"))
    compiled = check(model, oracle="ort", feeds=feeds, cpu_kernels="portable")
    assert ops(compiled) == ["LSTM"] and compiled.graph.nodes[0].domain == "fusegraph"


def test_run_time_weights_are_declined():
    model, feeds = recurrent_model("LSTM", initial=False)
    r = next(i for i in model.graph.initializer if i.name == "R")
    feeds["R"] = numpy_helper.to_array(r)
    model.graph.initializer.remove(r)
    model.graph.input.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, list(feeds["R"].shape)))
    compiled = check(model, oracle="ort", feeds=feeds)
    assert compiled.graph.nodes[0].domain == ""
    assert any(f.rule == "lstm_gate_order" and "not a constant" in f.reason for f in compiled.report.fusions)


def test_gru_and_rnn_are_left_alone():
    for op in ("GRU", "RNN"):
        model, feeds = recurrent_model(op)
        compiled = check(model, oracle="ort", feeds=feeds)
        assert [(n.domain, n.op_type) for n in compiled.graph.nodes] == [("", op)]
