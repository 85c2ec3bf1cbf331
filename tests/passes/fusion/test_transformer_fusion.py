"""BERT- and GPT-2-style exports (tests/conftest.py's ``transformer_models``) at O2: the
transformer fusions apply (one SDPA node per layer, LayerNorms with their residual Add, the
FFN's linear + GELU as one node, every weight product a LinearAct), outputs match onnxruntime (ORT_DISABLE_ALL) at rtol 1e-4,
and the kernels launched per run are no more than onnxruntime's node count at
ORT_ENABLE_EXTENDED (its optimised model, written through ``optimized_model_filepath``)."""
import onnx
import pytest

import fusegraph as fg
from model_builders import transformer_feeds
from oracle import assert_outputs_close, ort_run

pytestmark = pytest.mark.slow
LAYERS = 2


def ort_extended_node_count(path, tmp_path) -> int:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "extended.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_fused_export_matches_onnxruntime(transformer_models, name, tmp_path):
    path = transformer_models[name]
    compiled = fg.compile(str(path), fg.Config(level="O2", verify_each=True))
    hist = compiled.graph.op_histogram()
    assert hist.get("ScaledDotProductAttention") == LAYERS
    assert hist.get("SkipLayerNorm", 0) >= 2 * LAYERS
    acts = [n.attrs["activation"] for n in compiled.graph.nodes if n.op_type == "LinearAct"]
    assert sum(a.startswith("gelu") for a in acts) == LAYERS       # the FFN's linear + GELU
    assert not {"MatMul", "Linear", "Gemm"} & set(hist)             # every weight product is one LinearAct
    assert not {"Softmax", "IsNaN", "Erf", "Tanh", "Pow", "LayerNormalization"} & set(hist), hist
    applied = {f.rule for f in compiled.report.fusions if f.applied}
    assert {"attention", "skip_layer_norm", "linear_act", "gelu"} <= applied

    theirs = ort_extended_node_count(path, tmp_path)
    print(f"{name}: fusegraph O2 {compiled.report.kernel_count} kernels, onnxruntime extended {theirs} nodes")
    assert compiled.report.kernel_count <= theirs

    unoptimised = fg.compile(str(path), fg.Config(level="O0"))
    for batch, seq, seed in ((1, 16, 1), (2, 7, 2), (1, 1, 3)):
        feeds = transformer_feeds(seed=seed, batch=batch, seq=seq, pad=min(3, seq - 1))
        got = compiled.run(feeds)
        assert_outputs_close(got, ort_run(str(path), feeds))
        assert_outputs_close(got, unoptimised.run(feeds))
