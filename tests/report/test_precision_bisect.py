"""``fusegraph.tools.precision_bisect`` (``fusegraph bisect --precision bf16``): an op planted
to be precision-sensitive (``1000 - relu(conv(x))`` before a LayerNorm: in bf16, 8 bits of
mantissa, the values near 1000 are 4 apart, and the small signal is lost) must be ranked
first, by its node name; the same model with a small constant has no sensitive op."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as H
from onnx import numpy_helper

from fusegraph.cli.main import main
from fusegraph.errors import UsageError
from fusegraph.tools.precision_bisect import precision_bisect


def planted_model(big: float, batch="1"):
    """x -> Conv -> Relu -> Sub(big, .) -> LayerNorm -> Conv -> LayerNorm -> y. The Sub is a
    FOLLOW op: its input comes out of a bf16 conv, so it runs in bf16; its output feeds a KEEP
    op (LayerNorm, float32), which removes the large mean and leaves only the rounding."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(big, np.float32), "big"),
             numpy_helper.from_array(np.ones(16, np.float32), "scale"),
             numpy_helper.from_array(np.zeros(16, np.float32), "shift")]
    nodes = [H.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             H.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             H.make_node("Sub", ["big", "r1"], ["s1"], name="sub_big"),
             H.make_node("LayerNormalization", ["s1", "scale", "shift"], ["l1"], name="ln1", axis=-1),
             H.make_node("Conv", ["l1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             H.make_node("LayerNormalization", ["c2", "scale", "shift"], ["y"], name="ln2", axis=-1)]
    g = H.make_graph(nodes, "planted", [H.make_tensor_value_info("x", T.FLOAT, [int(batch) if batch.isdigit() else batch, 4, 16, 16])],
                     [H.make_tensor_value_info("y", T.FLOAT, [int(batch) if batch.isdigit() else batch, 8, 16, 16])],
                     inits)
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def test_planted_precision_sensitive_op_is_ranked_first():
    result = precision_bisect(planted_model(1000.0), precision="bf16")
    first = result.worst
    assert first is not None and (first.node, first.op, first.dtype) == ("sub_big", "Sub", "bf16")
    assert first.sensitivity > 0.3 and first.why             # the signal is lost, and the policy says why
    assert all(r.sensitivity < 1e-2 for r in result.ranked[1:])  # the convs round once: harmless
    assert {r.op for r in result.ranked} >= {"Sub", "FusedConv"}   # REDUCE and FOLLOW ops both ranked
    assert result.error > 0.3                                 # the whole bf16 model is off as well
    text = result.to_text()
    assert "sub_big" in text and text.index("sub_big") < text.index("FusedConv")


def test_a_model_with_a_symbolic_dim_is_ranked_on_its_one_compile():
    """The hooks index the order of the compile that runs (one for every shape): the planted
    op is found in a model whose batch dim is symbolic too."""
    result = precision_bisect(planted_model(1000.0, batch="n"), precision="bf16")
    assert result.worst.node == "sub_big" and result.worst.sensitivity > 0.3


def test_ordinary_model_has_no_sensitive_op():
    result = precision_bisect(planted_model(1.0), precision="bf16")
    assert result.ranked and result.worst.sensitivity < 1e-2
    assert result.error < 1e-2
    sub = next(r for r in result.ranked if r.node == "sub_big")   # still ranked, now harmless
    assert sub.sensitivity < 1e-2


def test_fp16_and_given_feeds():
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)}
    result = precision_bisect(planted_model(1000.0), precision="fp16", feeds=feeds, top=1)
    assert result.precision == "fp16" and all(r.dtype == "fp16" for r in result.ranked)
    assert result.worst.node == "sub_big"      # fp16 keeps 10 bits: 0.5 apart near 1000, still the worst
    assert "more" in result.to_text()         # top=1: the rest is counted, not listed


def test_unknown_precision_is_refused():
    with pytest.raises(UsageError, match="bf16, fp16"):
        precision_bisect(planted_model(1000.0), precision="fp8")


def test_cli_prints_the_planted_op(tmp_path, capsys):
    onnx.save(planted_model(1000.0), tmp_path / "m.onnx")
    code = main(["bisect", str(tmp_path / "m.onnx"), "--precision", "bf16", "--top", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "sub_big" in out and "bf16" in out
    rows = [line for line in out.splitlines() if line.lstrip("│ ").startswith(("1 ", "2 ", "3 "))]
    assert len(rows) == 2 and "sub_big" in rows[0]          # --top 2: two rows, the planted op first


@pytest.mark.parametrize("argv", [["--top", "3"], ["--precision", "bf16", "--rtol", "0.1"],
                                  ["--precision", "bf16", "--reference", "onnxruntime"]])
def test_cli_flags_of_the_other_bisect_are_refused(tmp_path, capsys, argv):
    onnx.save(planted_model(1000.0), tmp_path / "m.onnx")
    code = main(["bisect", str(tmp_path / "m.onnx"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fusegraph: error:") and "Traceback" not in err, err
