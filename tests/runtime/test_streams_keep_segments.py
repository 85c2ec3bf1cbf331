"""Streams keep the fused kernels: with the default config (script segments on) a model planned
on 2 or 4 streams runs script segments cut at the plan's events, not node by node, and its
outputs are bit for bit the one-stream model's (which runs at 2 intra-op threads, the streams
at one each). The segments a stream plan makes round-trip through the artifact too (the
loaded model, whose segments compile at their first call on a stream's thread, equal to fp32
rounding: rtol 1e-4)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph import zoo
from fusegraph.runtime.backends.cpu import onednn_graph
from fusegraph.runtime.threads import machine_cores

pytestmark = [pytest.mark.skipif(not onednn_graph.AVAILABLE, reason="this torch has no oneDNN Graph bridge"),
              pytest.mark.skipif(machine_cores() < 2, reason="needs 2 cores for 2 threads")]


@pytest.fixture(scope="module", params=zoo.LIGHT_MODELS)
def one_stream(request):
    proto = zoo.expose_logits(zoo.randomize_weights(onnx.load(zoo.light_model_path(request.param)), seed=0))
    feeds = zoo.random_feeds(proto, seed=1)
    model = fg.compile(proto, fg.Config(threads=2))
    return request.param, proto, feeds, model.run(feeds), model.report.python_calls


@pytest.mark.parametrize("streams", [2, 4])
def test_streams_run_segments_and_match_one_stream_bitwise(one_stream, streams, tmp_path):
    name, proto, feeds, want, _ = one_stream
    model = fg.compile(proto, fg.Config(threads=2, streams=streams))
    planned = model.plan.streams.num_streams if model.plan.streams is not None else 1
    if planned > 1:
        assert model.report.segments, f"{name}: {planned} streams ran no script segment"
        assert model.report.python_calls < model.report.kernel_count
    for _ in range(3):
        got = model.run(feeds)
        for k in want:
            assert np.array_equal(got[k], want[k], equal_nan=True), \
                f"{name} streams={streams}: {k} differs by {np.abs(got[k] - want[k]).max()}"
    path = tmp_path / "m.fgm"
    model.save(path)
    loaded = fg.load(path)
    assert len(loaded.report.segments) == len(model.report.segments)
    got = loaded.run(feeds)       # kernels compiled at their first call, on a stream's thread: equal
    for k in want:                # up to fp32 rounding (inception_v1 / v2: up to 1e-5 relative)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want[k]).max())),
                                   err_msg=f"{name} streams={streams}, loaded")
    model.close()
    loaded.close()
