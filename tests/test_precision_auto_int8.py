"""``precision="auto"`` choosing int8 per product (issue 37 part 4, ``compiler/precision_auto.py``
and ``compiler/int8_search.py``): with calibration inputs on a CPU whose int8 kernels are
exact, a net whose conv2 is planted to be quantisation-sensitive (one input channel a thousand
times the others) gets conv2 kept float32 and the other products int8 under a tight budget,
within that budget against onnxruntime fp32 on the calibration inputs, the choice per product
in ``report.precision`` (and its summary line, the HTML page, a saved and loaded artifact);
without calibration inputs, or where the int8 kernels are not exact, the bf16 search as before,
saying why not int8."""
from __future__ import annotations

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.cli.common import precision_line
from fusegraph.compiler import precision_auto
from fusegraph.tools.html.page import render_html

import int8_models as M

pytest.importorskip("onnxruntime")
BUDGET = 3e-2
needs_int8_kernels = pytest.mark.skipif(not M.int8_kernels_exact(), reason=M.INT8_KERNELS_WHY)




@pytest.fixture(scope="module")
def planted():
    model = M.outlier_net(seed=1)
    compiled = fg.compile(model, fg.Config(threads=2, precision="auto", accuracy_budget=BUDGET),
                          calibration_inputs=M.calibration_feeds(model))
    yield model, compiled
    compiled.close()


@needs_int8_kernels
def test_auto_keeps_the_sensitive_product_fp32_and_quantises_the_rest(planted):
    model, compiled = planted
    prec = compiled.report.precision
    assert prec["policy"] == "auto" and prec["auto"]["chosen"] == "int8"
    dtypes = {r["node"]: r["dtype"] for r in prec["nodes"]}
    assert dtypes == {"conv1": "int8", "conv2": "fp32", "conv3": "int8", "conv4": "int8", "head": "int8"}
    conv2 = next(r for r in prec["nodes"] if r["node"] == "conv2")
    assert conv2["code"] == "auto_budget" and "budget" in conv2["why"]
    assert [k["node"] for k in prec["auto"]["kept_fp32"]] == ["conv2"]
    search = prec["auto"]["int8"]
    assert search["int8_error"] > 0.2 > BUDGET >= prec["auto"]["error"]        # all-int8 is far off; kept: within
    assert search["steps"][0] == {"kept": 0, "error": search["int8_error"]}
    # what was built is within budget against an independent fp32 oracle, on the calibration inputs
    for feeds in M.calibration_feeds(model):
        assert M.rel_l2(compiled.run(feeds)["y"], M.ort_run(model, feeds)[0]) <= BUDGET * 1.001
    assert sum(n.op_type in ("QConv", "QLinear") for n in compiled.graph.nodes) >= 3
    line = precision_line(compiled.report)
    assert "auto chose int8" in line and "1 product(s) kept fp32" in line


@needs_int8_kernels
def test_a_loose_budget_quantises_every_product():
    model = M.outlier_net(seed=1, outlier=1.0)
    compiled = fg.compile(model, fg.Config(threads=2, precision="auto", accuracy_budget=0.2),
                          calibration_inputs=M.calibration_feeds(model))
    try:
        prec = compiled.report.precision
        assert prec["auto"]["chosen"] == "int8" and prec["auto"]["kept_fp32"] == []
        assert prec["by_dtype"] == {"int8": 5}
    finally:
        compiled.close()


@needs_int8_kernels
def test_the_html_and_the_artifact_carry_the_choice(planted, tmp_path):
    model, compiled = planted
    page = render_html(compiled)
    for node, dtype in (("conv1", "int8"), ("conv2", "fp32"), ("head", "int8")):
        assert f"<td>{node}</td><td>Conv</td><td>{dtype}</td>" in page or \
            f"<td>{node}</td><td>Gemm</td><td>{dtype}</td>" in page
    assert 'precision="auto": chose int8' in page and "int8 quantisation" in page
    compiled.save(tmp_path / "m.fgm")
    loaded = fg.load(tmp_path / "m.fgm")
    try:
        feeds = M.calibration_feeds(model, 1)[0]
        assert np.array_equal(loaded.run(feeds)["y"], compiled.run(feeds)["y"])
        assert loaded.report.precision["auto"]["chosen"] == "int8"
    finally:
        loaded.close()


def test_without_calibration_auto_is_the_bf16_search_and_says_why_not_int8():
    model = M.outlier_net(seed=1)
    auto = fg.compile(model, fg.Config(threads=2, precision="auto")).report.precision["auto"]
    assert auto["chosen"] in ("bf16", "fp32") and "no calibration_inputs" in auto["int8"]["why"]


def test_where_int8_is_not_exact_auto_does_not_try_it(monkeypatch):
    monkeypatch.setattr(precision_auto, "int8_declined", lambda device: "no VNNI here")
    model = M.outlier_net(seed=1)
    auto = fg.compile(model, fg.Config(threads=2, precision="auto"),
                      calibration_inputs=M.calibration_feeds(model)).report.precision["auto"]
    assert auto["chosen"] != "int8" and auto["int8"] == {"chosen": False, "why": "no VNNI here"}
