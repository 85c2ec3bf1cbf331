"""Streams run the same kernels as one stream: a model planned on 2 or 4 streams runs the same
oneDNN primitives (same implementations, each with its own scratchpad per stream thread) and
its outputs are bit for bit the one-stream model's, compiled and after a save / load. Where
oneDNN's kernels on this CPU sum in an order that depends on their thread count (AVX2's:
the one-stream model at 1 thread differs from it at 2, and a stream's worker runs fewer
threads), the outputs agree within float32 rounding instead."""
from __future__ import annotations

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.config import machine_cores

pytestmark = pytest.mark.skipif(machine_cores() < 2, reason="needs 2 cores for 2 threads")


@pytest.fixture(scope="module", params=zoo.LIGHT_MODELS_BUT_LARGE_CHAINS)   # a chain: bvlc_alexnet
def one_stream(request):
    proto = zoo.expose_logits(zoo.random_light_model(request.param))
    feeds = zoo.random_feeds(proto, seed=1)
    model = fg.compile(proto, fg.Config(threads=2))
    want = model.run(feeds)
    one_thread = fg.compile(proto, fg.Config(threads=1)).run(feeds)
    bitwise = all(np.array_equal(one_thread[k], want[k], equal_nan=True) for k in want)
    return request.param, proto, feeds, want, model.report.kernels["implementations"], bitwise


def _same(got: dict, want: dict, bitwise: bool, what: str) -> None:
    for k in want:
        if bitwise:
            assert np.array_equal(got[k], want[k], equal_nan=True), \
                f"{what}: {k} differs by {np.abs(got[k] - want[k]).max()}"
        else:
            scale = max(1.0, float(np.abs(want[k]).max()))      # sums of other orders: an ulp of the largest
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=2e-6 * scale, err_msg=f"{what}: {k}")


@pytest.mark.parametrize("streams", [2, 4])
def test_streams_match_one_stream_bitwise(one_stream, streams, tmp_path):
    name, proto, feeds, want, impls, bitwise = one_stream
    model = fg.compile(proto, fg.Config(threads=2, streams=streams))
    assert model.report.kernels["implementations"] == impls, f"{name}: other kernels under streams"
    for _ in range(3):
        _same(model.run(feeds), want, bitwise, f"{name} streams={streams}")
    path = tmp_path / "m.fgm"
    model.save(path)
    loaded = fg.load(path)
    _same(loaded.run(feeds), want, bitwise, f"{name} streams={streams}, loaded")
    model.close()
    loaded.close()
