"""BERT- and GPT-2-style exports (tests/conftest.py's ``transformer_models``): after O1 the
node count is no higher than onnxruntime's ORT_ENABLE_BASIC, the Shape/Gather/Concat chains
fold (all of them once the input shapes are static; with dynamic batch / sequence, those
reading only static dims or feeding a Reshape of the same tensor), and outputs still match
onnxruntime (ORT_DISABLE_ALL)."""
import onnx
import pytest

import fusegraph as fg
from model_builders import static_shapes, transformer_feeds
from oracle import assert_outputs_close, ort_run
from passes_util import ort_basic_node_count

pytestmark = pytest.mark.slow
SHAPE_CHAIN_OPS = {"Shape", "Size", "Concat", "Unsqueeze", "ConstantOfShape", "Range", "Equal"}


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_dynamic_export_count_and_outputs(transformer_models, name, tmp_path):
    path = transformer_models[name]
    compiled = fg.compile(str(path), fg.Config(level="O1", verify_each=True))
    ours, theirs = len(compiled.graph.nodes), ort_basic_node_count(path, tmp_path)
    print(f"{name} (dynamic): fusegraph O1 {ours} nodes, onnxruntime basic {theirs}")
    assert ours <= theirs
    basic = onnx.load(str(tmp_path / "basic.onnx"), load_external_data=False)
    shapes_ort = sum(n.op_type == "Shape" for n in basic.graph.node)
    assert compiled.graph.op_histogram().get("Shape", 0) <= shapes_ort
    o2 = fg.compile(str(path), fg.Config(level="O2", verify_each=True))
    for batch, seq in ((1, 16), (2, 7)):
        feeds = transformer_feeds(seed=batch, batch=batch, seq=seq)
        want = ort_run(str(path), feeds)
        assert_outputs_close(compiled.run(feeds), want)
        assert_outputs_close(o2.run(feeds), want)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_static_export_folds_every_shape_chain(transformer_models, name, tmp_path):
    m = static_shapes(transformer_models[name])
    compiled = fg.compile(m, fg.Config(level="O1", verify_each=True))
    left = SHAPE_CHAIN_OPS & set(compiled.graph.op_histogram())
    assert not left, f"shape-chain ops left: {left}"
    onnx.save(m, str(tmp_path / "static.onnx"))
    assert len(compiled.graph.nodes) <= ort_basic_node_count(tmp_path / "static.onnx", tmp_path)
    feeds = transformer_feeds(seed=3, batch=1, seq=16)
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds))
