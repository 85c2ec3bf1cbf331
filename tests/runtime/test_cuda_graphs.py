"""CUDA graphs (``Config.cuda_graph``): a model whose kernels never wait on the host is captured
whole, and a model that must (an If on a computed condition) falls back to eager runs without
leaving the capture, or any stream of its own, behind. Needs a GPU; skipped without one."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import fusegraph as fg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _layer_norm_model():
    """Two LayerNormalizations around a MatMul: the norm's NaN check must stay on the device."""
    rng = np.random.default_rng(0)
    init = [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel())
            for n, a in (("g", rng.standard_normal(64).astype(np.float32)),
                         ("b", rng.standard_normal(64).astype(np.float32)),
                         ("w", (rng.standard_normal((64, 64)) / 8).astype(np.float32)))]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n1"], axis=-1),
             helper.make_node("MatMul", ["n1", "w"], ["m"]),
             helper.make_node("LayerNormalization", ["m", "g", "b"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _if_model():
    """``y = x * 2 if sum(x) > 0 else x * 3``: the branch is chosen on the host."""
    def branch(name, k):
        return helper.make_graph(
            [helper.make_node("Mul", ["x", f"k{k}"], [f"y{k}"])], name, [],
            [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [4, 8])],
            [helper.make_tensor(f"k{k}", TensorProto.FLOAT, [], [float(k)])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then", 2), else_branch=branch("else", 3))]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_layer_norm_model_is_captured_whole():
    x = {"x": np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)}
    want = fg.compile(_layer_norm_model(), fg.Config(memory="off")).run(x)["y"]
    model = fg.compile(_layer_norm_model(), fg.Config(device="cuda", cuda_graph=True))
    for _ in range(3):
        np.testing.assert_allclose(model.run(x)["y"], want, rtol=1e-4, atol=1e-5)
    assert model._executor._runner.graph_error is None
    assert model._executor._runner._cuda_graph is not None


def test_a_failed_capture_falls_back_and_leaves_the_streams_alone():
    rng = np.random.default_rng(2)
    xs = [{"x": sign * np.abs(rng.standard_normal((4, 8))).astype(np.float32)} for sign in (1.0, -1.0, 1.0)]
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        model = fg.compile(_if_model(), fg.Config(device="cuda", cuda_graph=True))
        model.run(xs[0])
    for x in xs:
        want = x["x"] * (2.0 if x["x"].sum() > 0 else 3.0)
        np.testing.assert_array_equal(model.run(x)["y"], want)
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert model._executor._runner.graph_error           # it says why it runs eagerly
    other = fg.compile(_layer_norm_model(), fg.Config(device="cuda", cuda_graph=True))
    other.run({"x": np.ones((8, 64), np.float32)})           # the failed capture left nothing open
    assert other._executor._runner.graph_error is None


def test_the_transformers_are_captured_whole(transformer_models):
    """BERT's exact GELU and its layer norms keep their Inf / NaN handling on the device."""
    from model_builders import static_shapes, transformer_feeds
    feeds = transformer_feeds(seq=32)
    for name, path in transformer_models.items():
        proto = static_shapes(path, 1, 32)
        want = fg.compile(proto, fg.Config(memory="off")).run(feeds)
        model = fg.compile(proto, fg.Config(device="cuda", cuda_graph=True))
        for _ in range(2):
            got = model.run(feeds)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-4, err_msg=name)
        assert model._executor._runner.graph_error is None, (name, model._executor._runner.graph_error)
