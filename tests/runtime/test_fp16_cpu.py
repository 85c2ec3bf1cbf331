"""``precision="fp16"`` on CPU (issue 16): FusedConv and LinearAct keep float16 storage and
compute in float32 inside oneDNN's float32 kernels (``conv.FP16_COMPUTE``, ``linear.FP16_COMPUTE``;
benchmarks/RESULTS.md "fp16 on CPU"). Checked against onnxruntime ORT_DISABLE_ALL (float32) on
squeezenet (relative L2 <= 1e-2) and a small BERT (<= 1e-3), and that those kernels, not a
fallback, are the ones bound."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from model_builders import small_transformer, static_shapes, transformer_feeds
from oracle import ort_run

import fusegraph as fg
from fusegraph import zoo
from fusegraph.runtime.backends.cpu import prepack
from fusegraph.runtime.backends.protocol import Deferred

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def _rel_l2(got: dict, want: dict) -> float:
    worst = 0.0
    for name, w in want.items():
        g = np.asarray(got[name], np.float64)
        assert np.isfinite(g).all(), f"{name}: non-finite values"
        worst = max(worst, float(np.linalg.norm(g - w) / np.linalg.norm(w.astype(np.float64))))
    return worst


def _heavy_kernels(model, op_type: str) -> list:
    calls = [c for c in model._executor.binding.calls if c.node.op_type == op_type]
    assert calls, f"no {op_type} node bound"
    return calls


def _assert_fp32_compute(model, op_type: str) -> int:
    """Every float16 ``op_type`` node is bound to the float32-compute kernel and none declined;
    returns how many there are (the logits stay float32 by policy)."""
    declined = [d for d in model.report.kernels["declined"] if d["op"] == op_type]
    assert not declined, declined
    reduced = [c for c in _heavy_kernels(model, op_type) if c.node.outputs[0].dtype == fg.ir.DType.FLOAT16]
    for call in reduced:
        kernel = call.kernel
        assert getattr(kernel, "fp16_compute", None) == "fp32", (call.node.name, kernel)
        if isinstance(kernel, Deferred):
            assert kernel.resolve().fp16_compute == "fp32"
    return len(reduced)


@pytest.fixture(scope="module")
def squeezenet():
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path("squeezenet")), seed=0)
    return proto, zoo.random_feeds(proto)


def test_fp16_conv_model_matches_onnxruntime(squeezenet, tmp_path):
    proto, feeds = squeezenet
    model = fg.compile(proto, fg.Config(threads=2, precision="fp16"))
    got = model.run(feeds)
    assert _rel_l2(got, ort_run(proto, feeds)) <= 1e-2
    assert _assert_fp32_compute(model, "FusedConv") >= 20
    # the artifact carries the float32 packed forms made for the float16 weights: a load reorders none
    path = tmp_path / "sq16.fgm"
    model.save(path)
    before = prepack.reorders[0]
    loaded = fg.load(path)
    again = loaded.run(feeds)
    assert prepack.reorders[0] == before
    for name in got:
        np.testing.assert_array_equal(again[name], got[name])
    loaded.close()
    model.close()


def test_fp16_native_switch_is_what_runs(squeezenet, monkeypatch):
    """With ``FP16_COMPUTE = "fp16"`` the convolutions decline to their portable float16 kernel,
    so the attribute checked above is the fp32-compute path's own."""
    from fusegraph.runtime.backends.cpu import conv
    monkeypatch.setattr(conv, "FP16_COMPUTE", "fp16")
    proto, _ = squeezenet
    model = fg.compile(proto, fg.Config(threads=2, precision="fp16"))
    assert any(d["op"] == "FusedConv" for d in model.report.kernels["declined"])
    assert not any(getattr(c.kernel, "fp16_compute", None) for c in _heavy_kernels(model, "FusedConv"))
    model.close()


@pytest.fixture(scope="module")
def small_bert(tmp_path_factory):
    module, args, names = small_transformer("bert", hidden=64, layers=2, heads=4)
    path = tmp_path_factory.mktemp("fp16") / "bert.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), opset_version=17, dynamo=False, input_names=names,
                          output_names=["last_hidden_state"])
    return static_shapes(path, batch=2, seq=16), transformer_feeds(batch=2, seq=16)


def test_fp16_transformer_matches_onnxruntime(small_bert):
    proto, feeds = small_bert
    model = fg.compile(proto, fg.Config(threads=2, precision="fp16"))
    assert _rel_l2(model.run(feeds), ort_run(proto, feeds)) <= 1e-3
    assert _assert_fp32_compute(model, "LinearAct") >= 2
    model.close()
