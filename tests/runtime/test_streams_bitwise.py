"""Streams run the same kernels as one stream: a model planned on 2 or 4 streams runs the same
oneDNN primitives (same implementations, each with its own scratchpad per stream thread) and
its outputs are bit for bit the one-stream model's, compiled and after a save / load."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph import zoo
from fusegraph.runtime.threads import machine_cores

pytestmark = pytest.mark.skipif(machine_cores() < 2, reason="needs 2 cores for 2 threads")


@pytest.fixture(scope="module", params=zoo.LIGHT_MODELS)
def one_stream(request):
    proto = zoo.expose_logits(zoo.randomize_weights(onnx.load(zoo.light_model_path(request.param)), seed=0))
    feeds = zoo.random_feeds(proto, seed=1)
    model = fg.compile(proto, fg.Config(threads=2))
    return request.param, proto, feeds, model.run(feeds), model.report.kernels["implementations"]


@pytest.mark.parametrize("streams", [2, 4])
def test_streams_match_one_stream_bitwise(one_stream, streams, tmp_path):
    name, proto, feeds, want, impls = one_stream
    model = fg.compile(proto, fg.Config(threads=2, streams=streams))
    assert model.report.kernels["implementations"] == impls, f"{name}: other kernels under streams"
    for _ in range(3):
        got = model.run(feeds)
        for k in want:
            assert np.array_equal(got[k], want[k], equal_nan=True), \
                f"{name} streams={streams}: {k} differs by {np.abs(got[k] - want[k]).max()}"
    path = tmp_path / "m.fgm"
    model.save(path)
    loaded = fg.load(path)
    got = loaded.run(feeds)
    for k in want:
        assert np.array_equal(got[k], want[k], equal_nan=True), f"{name} streams={streams}, loaded: {k}"
    model.close()
    loaded.close()
