"""Independent oracles for tests: onnxruntime with all optimisations off, and onnx.reference.

Never the optimiser itself. onnxruntime is a test dependency only.
"""
from __future__ import annotations

import numpy as np
import onnx


def ort_run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray], level: str = "disable_all",
            threads: int = 2) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    data = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def assert_outputs_close(got: dict, want: dict, rtol: float = 1e-4, atol: float = 1e-5,
                         scale_atol: bool = True) -> None:
    """rtol / atol as given; with ``scale_atol`` the atol is taken relative to the output's
    largest magnitude (when above 1). Deep fp32 networks differ from onnxruntime by float
    reassociation noise proportional to the output scale: onnxruntime's own ORT_ENABLE_ALL vs
    ORT_DISABLE_ALL outputs differ by 1e-4 on resnet50 logits of magnitude 6."""
    assert list(got) == list(want), f"output names differ: {list(got)} vs {list(want)}"
    for name in want:
        assert got[name].dtype == want[name].dtype, f"{name}: dtype {got[name].dtype} vs {want[name].dtype}"
        assert got[name].shape == want[name].shape, f"{name}: shape {got[name].shape} vs {want[name].shape}"
        scale = float(np.abs(want[name]).max()) if scale_atol and want[name].size and \
            np.issubdtype(want[name].dtype, np.floating) else 1.0
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol * max(1.0, scale),
                                   err_msg=f"output {name}")


def assert_same_as(got, want, where: str, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    """``got`` equals ``want`` in dtype and shape and to tolerance; lists (sequences) item by item."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same_as(g, w, f"{where}[{k}]", rtol, atol)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, where
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=where)


def check_compiled_and_loaded(model, feeds: dict, path):
    """Compile ``model``, save it to ``path`` and load it; both runs equal onnxruntime
    ORT_DISABLE_ALL's (same output names, dtypes, shapes; rtol 1e-4). Returns (the compiled
    model, onnxruntime's outputs)."""
    import fusegraph as fg
    want = ort_run(model, feeds)
    compiled = fg.compile(model)
    compiled.save(path)
    for m in (compiled, fg.load(path)):
        got = m.run(feeds)
        assert list(got) == list(want)
        for k in want:
            assert_same_as(got[k], want[k], k)
    return compiled, want
