"""``fusegraph bisect MODEL --precision int8`` (``tools/int8_bisect.py``, issue 37 part 4): a
product planted to be quantisation-sensitive (conv2, whose input has one channel a thousand
times the others: quantised per tensor, the other channels keep a few levels) must be ranked
first by its node name, its error alone matching the model with only it quantised compiled
through the public API and measured against onnxruntime fp32; the same net without the outlier
has no such product; the CLI takes a calibration directory."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph.cli.main import main
from fusegraph.tools.precision_bisect import precision_bisect

import int8_models as M

pytest.importorskip("onnxruntime")
CFG = fg.Config(threads=2)
needs_int8_kernels = pytest.mark.skipif(not M.int8_kernels_exact(), reason=M.INT8_KERNELS_WHY)




@pytest.fixture(scope="module")
def planted():
    model = M.outlier_net(seed=1)
    return model, precision_bisect(model, "int8", config=CFG, calibration=M.calibration_feeds(model))


@needs_int8_kernels
def test_the_planted_sensitive_product_is_ranked_first(planted):
    model, result = planted
    assert [r.node for r in result.ranked][0] == "conv2"
    assert {r.node for r in result.ranked} == {"conv1", "conv2", "conv3", "conv4", "head"}
    assert all(r.dtype == "int8" and r.why for r in result.ranked)
    first, rest = result.ranked[0], result.ranked[1:]
    assert first.sensitivity > 0.2 and all(r.sensitivity < first.sensitivity / 5 for r in rest)
    assert result.error > 0.2 and "4 calibration input(s) given" in result.calibration
    # conv2's figure is the model with only conv2 quantised, against onnxruntime fp32 (random feeds, seed 0)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    only = fg.compile(model, CFG.replace(precision="int8", op_precision={"Conv": "fp32", "Gemm": "fp32",
                                                                        "conv2": "int8"}),
                      calibration_inputs=M.calibration_feeds(model))
    try:
        assert {r["node"]: r["dtype"] for r in only.report.precision["nodes"]}["conv2"] == "int8"
        assert first.sensitivity == pytest.approx(M.rel_l2(only.run(feeds)["y"], M.ort_run(model, feeds)[0]), rel=1e-3)
    finally:
        only.close()
    text = result.to_text()
    assert "only that product quantised to int8" in text and text.index("conv2") < text.index("conv3")


@needs_int8_kernels
def test_without_the_outlier_no_product_stands_out():
    model = M.outlier_net(seed=1, outlier=1.0)
    result = precision_bisect(model, "int8", config=CFG, calibration=M.calibration_feeds(model))
    assert result.error < 0.1 and all(r.sensitivity < 0.1 for r in result.ranked)


@needs_int8_kernels
def test_a_symbolic_batch_is_bisected_on_its_one_compile():
    model = M.outlier_net(seed=1, batch="n")
    feeds = [{"x": f["x"][:1]} for f in M.calibration_feeds(M.outlier_net(seed=1))]
    result = precision_bisect(model, "int8", config=CFG, calibration=feeds)
    assert result.worst.node == "conv2" and result.worst.sensitivity > 0.2


def test_without_calibration_a_conv_net_is_calibrated_on_random_inputs():
    result = precision_bisect(M.outlier_net(seed=1), "int8", config=CFG)
    assert "random inputs of the model's input specs" in result.calibration
    assert len(result.ranked) == 5


def test_cli_bisect_int8(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    model = M.outlier_net(seed=1)
    path = tmp_path / "outlier.onnx"
    onnx.save(model, path)
    cal = tmp_path / "cal"
    cal.mkdir()
    for i, f in enumerate(M.calibration_feeds(model, 2)):
        np.savez(cal / f"{i}.npz", **f)
    assert main(["bisect", str(path), "--precision", "int8", "--calibration", str(cal), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "conv2" in out and "int8" in out and "calibration" in out      # the caption, wrapped to the table
    assert main(["bisect", str(path), "--precision", "bf16", "--calibration", str(cal)]) == 2
    assert "--calibration applies to --precision int8" in capsys.readouterr().err
    assert main(["bisect", str(path), "--calibration", str(cal)]) == 2
    assert "applies to a precision bisect" in capsys.readouterr().err
