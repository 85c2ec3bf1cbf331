"""Tiny models for the server's hardening and soak tests (compiled in seconds, run in
microseconds): a batched MLP, a Loop whose trip count comes from the request, and a model whose
outputs are NaN and infinities. ``small_repo(root)`` writes them as a model repository."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto as T, helper as H, numpy_helper as NH

OPSET = [H.make_opsetid("", 17)]


def mlp(batch="batch"):
    """x[batch, 8] -> MatMul -> Add -> Relu -> MatMul -> y[batch, 4] (He-scaled weights)."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 16)) * np.sqrt(2 / 8)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32) * 0.1
    w2 = (rng.standard_normal((16, 4)) * np.sqrt(2 / 16)).astype(np.float32)
    g = H.make_graph([H.make_node("MatMul", ["x", "w1"], ["h"]), H.make_node("Add", ["h", "b1"], ["a"]),
                      H.make_node("Relu", ["a"], ["r"]), H.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
                     [H.make_tensor_value_info("x", T.FLOAT, [batch, 8])],
                     [H.make_tensor_value_info("y", T.FLOAT, [batch, 4])],
                     [NH.from_array(w1, "w1"), NH.from_array(b1, "b1"), NH.from_array(w2, "w2")])
    return H.make_model(g, opset_imports=OPSET)


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """The MLP in NumPy (float64, an independent oracle)."""
    init = {t.name: NH.to_array(t).astype(np.float64) for t in mlp().graph.initializer}
    h = np.maximum(x.astype(np.float64) @ init["w1"] + init["b1"], 0)
    return h @ init["w2"]


def loop():
    """``y = x + n`` by a Loop of ``n`` iterations (``n``: an INT64 scalar from the request)."""
    body = H.make_graph([H.make_node("Add", ["acc_in", "one"], ["acc_out"]),
                         H.make_node("Identity", ["c_in"], ["c_out"])], "body",
                        [H.make_tensor_value_info("i", T.INT64, []), H.make_tensor_value_info("c_in", T.BOOL, []),
                         H.make_tensor_value_info("acc_in", T.FLOAT, [4])],
                        [H.make_tensor_value_info("c_out", T.BOOL, []), H.make_tensor_value_info("acc_out", T.FLOAT, [4])],
                        [NH.from_array(np.ones(4, np.float32), "one")])
    g = H.make_graph([H.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "loop",
                     [H.make_tensor_value_info("n", T.INT64, []), H.make_tensor_value_info("x", T.FLOAT, [4])],
                     [H.make_tensor_value_info("y", T.FLOAT, [4])])
    return H.make_model(g, opset_imports=OPSET)


def nonfinite():
    """y = log(x) and z = 1 / x: NaN for x < 0, -Inf and +Inf for x = 0."""
    g = H.make_graph([H.make_node("Log", ["x"], ["y"]), H.make_node("Reciprocal", ["x"], ["z"])], "nonfinite",
                     [H.make_tensor_value_info("x", T.FLOAT, [4])],
                     [H.make_tensor_value_info("y", T.FLOAT, [4]), H.make_tensor_value_info("z", T.FLOAT, [4])])
    return H.make_model(g, opset_imports=OPSET)


def small_repo(root: Path) -> Path:
    """``root/{mlp,loop,nonfinite}/model.onnx`` with their ``config.toml`` (one thread each; the
    MLP batches up to 4 requests)."""
    import onnx
    for name, model, config in (("mlp", mlp(), "max_batch_size = 4\nmax_queue_delay_ms = 5\nthreads = 1\n"),
                                ("loop", loop(), "threads = 1\n"), ("nonfinite", nonfinite(), "threads = 1\n")):
        folder = Path(root) / name
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(folder / "model.onnx"))
        (folder / "config.toml").write_text(config)
    return Path(root)
