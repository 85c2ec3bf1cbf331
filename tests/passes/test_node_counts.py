"""Whole-model checks on the onnx light models: after O1 no ConstantOfShape remains, the node
count is no higher than onnxruntime's with ORT_ENABLE_BASIC (counted in the model it writes
to ``optimized_model_filepath``), and outputs still match onnxruntime (ORT_DISABLE_ALL), with
the shipped weights and with random ones, logits included."""
import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph import zoo
from oracle import assert_outputs_close, ort_run
from passes_util import ort_basic_node_count

# Three models (alexnet, vgg19, zfnet512) have an fc6 weight of 144-392 MiB, above the
# default 64 MiB fold limit; the count comparison lifts the limit, as onnxruntime has none.
BIG = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize("name", zoo.LIGHT_MODELS)
def test_o1_node_count_not_above_onnxruntime_basic(name, tmp_path):
    path = zoo.light_model_path(name)
    compiled = fg.compile(str(path), fg.Config(level="O1", fold_size_limit=BIG))
    hist = compiled.graph.op_histogram()
    assert "ConstantOfShape" not in hist
    ours, theirs = len(compiled.graph.nodes), ort_basic_node_count(path, tmp_path)
    print(f"{name}: fusegraph O1 {ours} nodes, onnxruntime basic {theirs}")
    assert ours <= theirs


@pytest.mark.parametrize("name", ["bvlc_alexnet", "squeezenet"])
def test_default_fold_limit_reports_the_big_weights(name):
    compiled = fg.compile(str(zoo.light_model_path(name)), fg.Config(level="O1"))
    remaining = [n for n in compiled.graph.nodes if n.op_type == "ConstantOfShape"]
    reported = {u["node"] for u in compiled.report.unfolded}
    assert reported == {n.name for n in remaining}
    for n in remaining:
        size = 1
        for d in n.outputs[0].shape:
            size *= d
        assert size * 4 > 64 * MIB


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.LIGHT_MODELS)
def test_o1_outputs_match_onnxruntime(name):
    shipped = onnx.load(zoo.light_model_path(name))
    feeds = zoo.random_feeds(shipped, seed=1)
    got = fg.compile(shipped, fg.Config(level="O1", fold_size_limit=BIG)).run(feeds)
    assert_outputs_close(got, ort_run(shipped, feeds))
    rand = zoo.expose_logits(zoo.randomize_weights(shipped, seed=0))
    want = ort_run(rand, feeds)
    got = fg.compile(rand, fg.Config(level="O1")).run(feeds)
    # deep fp32 nets carry reassociation noise: allow twice onnxruntime's own (optimised vs
    # unoptimised) difference when that exceeds atol, as tests/models does
    noise = ort_run(rand, feeds, level="all")
    floor = max(float(np.abs(noise[k] - want[k]).max()) for k in want)
    assert_outputs_close(got, want, atol=max(1e-5, 2 * floor))
    logits = want.get("logits", want[next(iter(want))])
    assert logits.std() > 0.1, "random weights must keep the outputs O(1)"
