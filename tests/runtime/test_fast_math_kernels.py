"""``Config.fast_math`` on CPU: the kernels whose only difference from ONNX is NaN / Inf (oneDNN's
fused relu, clip, GELU, max pool) are used. On finite inputs the results match onnxruntime
ORT_DISABLE_ALL as tightly as the exact kernels do; on NaN the exact default keeps ONNX's
answer and fast_math need not (the trade the knob states)."""
from __future__ import annotations

import onnx
import pytest

import fusegraph as fg
from fusegraph import zoo
from fusegraph.runtime.backends.cpu import onednn_graph
from oracle import assert_outputs_close, ort_run

pytestmark = pytest.mark.skipif(not onednn_graph.AVAILABLE, reason="this torch has no oneDNN Graph bridge")


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_fast_math_kernels_match_onnxruntime_on_finite_inputs(name):
    model = zoo.expose_logits(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0))
    feeds = zoo.random_feeds(model, seed=3)
    fast = fg.compile(model, fg.Config(fast_math=True))
    exact = fg.compile(model, fg.Config())
    assert not fast._executor.backend.exact and exact._executor.backend.exact
    assert "aten::relu" in _segment_ir(fast) and "aten::relu" not in _segment_ir(exact)
    want = ort_run(model, feeds)
    assert_outputs_close(fast.run(feeds), want)


def _segment_ir(model) -> str:
    lowered = model._executor.code.lowered
    return "\n".join(c.kernel._ir for c in lowered.calls if hasattr(c.node, "nodes"))
