"""``fusegraph compare MODEL --precision int8`` (issue 37 part 4): int8 beside fp32, its error
and top-1 agreement recomputed here independently (onnxruntime ORT_DISABLE_ALL for fp32, the
int8 model compiled through the public API with the same calibration, numpy for the
metrics), the calibration said in the output (given, random inputs of the specs for a conv
net, dynamic for a MatMul model), RssAnon measured per side in its own process, and the CLI's
flags."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph.cli.main import main
from fusegraph.errors import UsageError
from fusegraph.tools.compare_precision import compare_precision, render_precision
from fusegraph.tools.int8_inputs import CALIBRATION_INPUTS, CALIBRATION_SEED

import int8_models as M

pytest.importorskip("onnxruntime")
CFG = fg.Config(threads=2)
INPUTS = 3



def accuracy_feeds(n=INPUTS):
    """What compare measures on: random inputs of the specs, seeds 0 .. n-1 (normal, as
    ``runtime.feeds.random_feeds`` writes them)."""
    return [{"x": np.random.default_rng(s).standard_normal((1, 3, 16, 16)).astype(np.float32)} for s in range(n)]



def _text(renderable) -> str:
    from rich.console import Console
    console = Console(record=True, width=220)
    console.print(renderable)
    return console.export_text()


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    model = M.conv_net(seed=5)
    path = tmp_path_factory.mktemp("int8cmp") / "conv_net.onnx"
    onnx.save(model, path)
    return model, str(path)


@pytest.fixture(scope="module")
def result(net):
    model, path = net
    return compare_precision(path, "int8", inputs=INPUTS, runs=2, config=CFG, calibration=M.calibration_feeds(model),
                             rss=True)


def test_int8_error_and_top1_match_an_independent_computation(net, result):
    model, path = net
    int8 = fg.compile(path, CFG.replace(precision="int8"), calibration_inputs=M.calibration_feeds(model))
    try:
        errs, agree = [], []
        for feeds in accuracy_feeds():
            want = M.ort_run(model, feeds)[0]                       # onnxruntime fp32, ORT_DISABLE_ALL
            got = int8.run(feeds)["y"]
            errs.append(M.rel_l2(got, want))
            agree.append(float(np.argmax(got) == np.argmax(want)))
        acc = result.accuracy["y"]
    finally:
        int8.close()
    assert result.reference == "onnxruntime (ORT_DISABLE_ALL)" and result.precision == "int8"
    assert acc["reduced"]["rel_l2"] == pytest.approx(max(errs), rel=1e-4)
    assert acc["reduced"]["top1_agree"] == pytest.approx(sum(agree) / len(agree))
    assert acc["reduced"]["inputs"] == INPUTS
    assert acc["fp32"]["rel_l2"] < 1e-5 < acc["reduced"]["rel_l2"] < 0.2          # int8 rounds; fp32 does not
    assert result.reduced.by_dtype.get("int8", 0) == 5 and result.fp32.by_dtype == {}
    assert "4 calibration input(s) given" in result.calibration


def test_sizes_and_private_memory_are_measured_per_side(result):
    for side in (result.fp32, result.reduced):
        assert side.artifact_bytes > 0 and side.latency_ms > 0
        assert side.rss_anon_bytes is not None and side.rss_anon_bytes > result.baseline_rss_bytes > 0
    text = _text(render_precision(result, "t"))
    for needle in ("RssAnon", "artifact (.fgm) size", "top-1 agreement", "int8 calibration: static, on the 4",
                   "int8 5", "rel L2 error"):
        assert needle in text, needle


def test_without_calibration_a_conv_net_is_calibrated_on_random_inputs_and_says_so(net):
    model, path = net
    result = compare_precision(path, "int8", inputs=2, runs=1, config=CFG)
    assert f"{CALIBRATION_INPUTS} random inputs of the model's input specs" in result.calibration
    # the same as calibrating on those random inputs explicitly
    given = [{"x": np.random.default_rng(CALIBRATION_SEED + i).standard_normal((1, 3, 16, 16)).astype(np.float32)}
             for i in range(CALIBRATION_INPUTS)]
    explicit = compare_precision(path, "int8", inputs=2, runs=1, config=CFG, calibration=given)
    assert result.accuracy["y"]["reduced"]["rel_l2"] == pytest.approx(explicit.accuracy["y"]["reduced"]["rel_l2"],
                                                                      rel=1e-6)
    wider = [{"x": f["x"] * 3} for f in given]          # other ranges: another model, another error
    assert result.accuracy["y"]["reduced"]["rel_l2"] != pytest.approx(
        compare_precision(path, "int8", inputs=2, runs=1, config=CFG,
                          calibration=wider).accuracy["y"]["reduced"]["rel_l2"], rel=1e-6)


def test_without_calibration_a_matmul_model_is_quantised_dynamically(tmp_path):
    model = M.matmul_block(seed=2)
    path = tmp_path / "mm.onnx"
    onnx.save(model, path)
    result = compare_precision(str(path), "int8", inputs=2, runs=1, config=CFG)
    assert result.calibration.startswith("dynamic")
    assert result.reduced.by_dtype.get("int8", 0) == 3
    dyn = fg.compile(str(path), CFG.replace(precision="int8"))        # no calibration: dynamic, as compare did
    try:
        errs = []
        for seed in range(2):
            feeds = {"x": np.random.default_rng(seed).standard_normal((1, 8, 32)).astype(np.float32)}
            errs.append(M.rel_l2(dyn.run(feeds)["y"], M.ort_run(model, feeds)[0]))
    finally:
        dyn.close()
    assert result.accuracy["y"]["reduced"]["rel_l2"] == pytest.approx(max(errs), rel=1e-4)
    assert result.accuracy["y"]["fp32"]["rel_l2"] < 1e-5 < max(errs)


def test_calibration_is_refused_where_it_changes_nothing(net):
    _, path = net
    with pytest.raises(UsageError, match="calibration inputs apply to --precision int8 or auto"):
        compare_precision(path, "bf16", inputs=1, runs=1, config=CFG, calibration=[{"x": None}])


def test_cli_compare_int8_with_a_calibration_directory(net, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    model, path = net
    for i, feeds in enumerate(M.calibration_feeds(model, 2)):
        np.savez(tmp_path / f"c{i}.npz", **feeds)
    assert main(["compare", path, "--precision", "int8", "--inputs", "2", "--runs", "2", "--threads", "2",
                 "--calibration", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fp32 vs int8" in out and "RssAnon" in out and "on the 2 calibration input(s) given" in out
    assert main(["compare", path, "--precision", "bf16", "--calibration", str(tmp_path)]) == 2
    assert "--calibration applies to --precision int8 or auto" in capsys.readouterr().err
    assert main(["compare", path, "--calibration", str(tmp_path)]) == 2
    assert "applies to the reduced side of --precision" in capsys.readouterr().err


def test_the_html_precision_section_lists_each_product_int8_or_fp32_and_why():
    from fusegraph.tools.html.page import render_html
    model = M.outlier_net(seed=1, outlier=1.0)
    names = ["conv1", "conv2", "conv3", "conv4", "head"]
    keep = "conv3"
    m = fg.compile(model, CFG.replace(precision="int8", op_precision={keep: "fp32"}),
                   calibration_inputs=M.calibration_feeds(model))
    try:
        page = render_html(m)
        rows = {r["node"]: r for r in m.report.precision["nodes"]}
    finally:
        m.close()
    assert set(rows) == set(names)
    for name in names:
        r = rows[name]
        assert r["dtype"] == ("fp32" if name == keep else "int8")
        assert f"<td>{name}</td><td>{r['op']}</td><td>{r['dtype']}</td><td>int8</td><td>" in page
    assert f"Config.op_precision: &#x27;{keep}&#x27; fp32" in page
    assert "int8 quantisation" in page and "quantised activations" in page and "static: calibrated (minmax) on 4" in page
