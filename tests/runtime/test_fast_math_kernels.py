"""``Config.fast_math`` on CPU: the kernels whose only difference from ONNX is NaN / Inf are used
(oneDNN's own relu and clip post-ops, its max pool without the finiteness check). On finite
inputs the results match onnxruntime ORT_DISABLE_ALL as tightly as the exact kernels do; on
NaN the exact default keeps ONNX's answer and fast_math need not (the trade the knob states)."""
from __future__ import annotations

import onnx
import pytest

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
from fusegraph.runtime.backends.cpu.guard import Guarded
from model_builders import mobilenetv2_onnx
from oracle import assert_outputs_close, ort_run

pytestmark = pytest.mark.skipif(not available(), reason="the oneDNN library does not load here")


def _post_ops(model) -> list[str]:
    """Per convolution with an activation: 'post-op', 'after' (applied after the primitive), or
    'guarded' (the post-op while the feeds admit it, after otherwise: ``cpu/guard.py``)."""
    out = []
    for c in model._executor.binding.calls:
        k = getattr(c.kernel, "kernel", c.kernel)         # a kernel that measures its output: its own
        if c.node.op_type == "FusedConv" and c.node.attrs.get("activation"):
            out.append("guarded" if isinstance(k, Guarded) else "after" if k.after is not None else "post-op")
    return out


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_fast_math_kernels_match_onnxruntime_on_finite_inputs(name):
    model = zoo.expose_logits(zoo.random_light_model(name))
    feeds = zoo.random_feeds(model, seed=3)
    fast = fg.compile(model, fg.Config(fast_math=True))
    exact = fg.compile(model, fg.Config())
    assert not fast._executor.backend.exact and exact._executor.backend.exact
    fast_pools, exact_pools = ([c.kernel for c in m._executor.binding.calls if c.node.op_type == "MaxPool"]
                               for m in (fast, exact))
    assert fast_pools and all(isinstance(k, DnnlKernel) and k.after is None for k in fast_pools)
    assert all(isinstance(k, Guarded) and k.exact.after is not None for k in exact_pools)   # the checked pool
    want = ort_run(model, feeds)
    assert_outputs_close(fast.run(feeds), want)
    assert_outputs_close(exact.run(feeds), want)


def test_fast_math_fuses_the_clip_the_exact_kernel_applies_after(tmp_path):
    """MobileNetV2's ReLU6: oneDNN's clip maps NaN to 0, so the exact model guards it (the clamp
    after the primitive for feeds that could bring a NaN there); fast_math makes it a post-op."""
    path = tmp_path / "m.onnx"
    mobilenetv2_onnx(str(path), width=0.35, size=96)
    exact, fast = (fg.compile(str(path), fg.Config(fast_math=f)) for f in (False, True))
    assert "guarded" in _post_ops(exact) and set(_post_ops(fast)) == {"post-op"}
    feeds = zoo.random_feeds(onnx.load(str(path)), seed=1)
    assert_outputs_close(fast.run(feeds), ort_run(onnx.load(str(path)), feeds))
