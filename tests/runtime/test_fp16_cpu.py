"""``precision="fp16"`` on CPU (issue 16): this CPU has no float16 arithmetic, so FusedConv and
LinearAct keep float16 storage and run oneDNN's float32 primitives over it (the input
converted in the kernel's staging buffer, the result rounded once into the float16 output;
``runtime/backends/cpu/dnnl/conv.py``, ``linear.py``). Checked against onnxruntime
ORT_DISABLE_ALL (float32) on squeezenet (relative L2 <= 1e-2) and a small BERT (<= 1e-3), that
those kernels, not a fallback, are the ones bound, and that a saved model loads without
reordering its (float32-packed) weights."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from model_builders import small_transformer, static_shapes, transformer_feeds
from oracle import ort_run

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
from fusegraph.runtime.backends.cpu.guard import Guarded

pytestmark = pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")


def _rel_l2(got: dict, want: dict) -> float:
    worst = 0.0
    for name, w in want.items():
        g = np.asarray(got[name], np.float64)
        assert np.isfinite(g).all(), f"{name}: non-finite values"
        worst = max(worst, float(np.linalg.norm(g - w) / np.linalg.norm(w.astype(np.float64))))
    return worst


def _fp32_compute(model, op_type: str) -> int:
    """Every float16 ``op_type`` node runs a float32 oneDNN primitive over float16 storage and
    none declined; returns how many there are (the logits stay float32 by policy)."""
    assert not [d for d in model.report.kernels["declined"] if d["op"] == op_type]
    reduced = [c for c in model._executor.binding.calls
               if c.node.op_type == op_type and c.node.outputs[0].dtype == fg.ir.DType.FLOAT16]
    for call in reduced:
        k = call.kernel
        k = k.fast if isinstance(k, Guarded) else k     # a guarded node: its fast kernel on finite feeds
        assert isinstance(k, DnnlKernel), call.node.name
        assert k.output.dtype == torch.float32 and k.inputs[0].dtype == torch.float32, call.node.name
    return len(reduced)


@pytest.fixture(scope="module")
def squeezenet():
    proto = zoo.random_light_model("squeezenet")
    return proto, zoo.random_feeds(proto)


def test_fp16_conv_model_matches_onnxruntime(squeezenet, tmp_path):
    proto, feeds = squeezenet
    model = fg.compile(proto, fg.Config(threads=2, precision="fp16"))
    got = model.run(feeds)
    assert _rel_l2(got, ort_run(proto, feeds)) <= 1e-2
    assert _fp32_compute(model, "FusedConv") >= 20
    path, fp32_path = tmp_path / "sq16.fgm", tmp_path / "sq32.fgm"
    model.save(path)
    fg.compile(proto, fg.Config(threads=2)).save(fp32_path)
    assert path.stat().st_size < 0.75 * fp32_path.stat().st_size    # float16 weights (the logits conv keeps float32)
    loaded = fg.load(path)
    assert loaded.load_info["weight_reorders"] >= 20                # packed again for the float32 primitives
    again = loaded.run(feeds)
    for name in got:
        np.testing.assert_array_equal(again[name], got[name])
    loaded.close()
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
    assert _fp32_compute(model, "LinearAct") >= 2
    model.close()
