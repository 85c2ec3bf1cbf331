"""The nine onnx light models at O2 (fusion and layout on), random He-scaled weights: outputs and
logits match onnxruntime with ORT_DISABLE_ALL (within the noise floor tests/models uses), and
the kernels launched per run are no more than onnxruntime's node count at ORT_ENABLE_EXTENDED."""
import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph.testing import zoo
from oracle import assert_outputs_close, ort_run


def ort_extended_nodes(proto, tmp_path) -> int:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "extended.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


@pytest.mark.parametrize("name", zoo.LIGHT_MODELS)
def test_o2_matches_onnxruntime_within_extended_kernel_budget(name, tmp_path):
    proto = zoo.expose_logits(zoo.random_light_model(name))
    feeds = zoo.random_feeds(proto, seed=1)
    compiled = fg.compile(proto, fg.Config(level="O2"))
    got = compiled.run(feeds)
    want = ort_run(proto, feeds)
    noise = ort_run(proto, feeds, level="all")
    floor = max(float(np.abs(noise[k] - want[k]).max()) for k in want)
    assert_outputs_close(got, want, atol=max(1e-5, 2 * floor))
    assert compiled.report.kernel_count <= ort_extended_nodes(proto, tmp_path)
    assert any(f.applied and f.rule.startswith("conv_") for f in compiled.report.fusions)
    left = [n.op_type for n in compiled.graph.nodes if n.op_type in ("BatchNormalization", "Conv")]
    assert not left, f"unfused convolutions / batch norms left: {left}"
    affine_after_conv = [n.name for n in compiled.graph.nodes if n.op_type in ("Mul", "Add")
                         and any(v.producer is not None and v.producer.op_type == "FusedConv" for v in n.inputs)
                         and any(v.is_const for v in n.inputs)]
    assert not affine_after_conv, f"a per-channel Mul / Add was left after a conv: {affine_after_conv}"
