"""The BERT- and GPT-2-style exports give identical outputs for streams=1, 2 and 4 (10 runs
each), every stream on one intra-op thread, against the one-stream model on one thread; the
one-stream result also matches onnxruntime (ORT_DISABLE_ALL)."""
import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.config import machine_cores
from model_builders import transformer_feeds
from oracle import assert_outputs_close, ort_run

REPS = 10


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def reference(request, transformer_models):
    path = str(transformer_models[request.param])
    feeds = transformer_feeds(seed=3, batch=2, seq=9)
    before = torch.get_num_threads()
    try:
        want = fg.compile(path, fg.Config(streams=1, threads=1)).run(feeds)
    finally:
        torch.set_num_threads(before)
    assert_outputs_close(want, ort_run(path, feeds))
    return request.param, path, feeds, want


@pytest.mark.slow
@pytest.mark.parametrize("streams", [1, 2, 4])
def test_transformer_exports_identical_for_1_2_4_streams(reference, streams):
    name, path, feeds, want = reference
    before = torch.get_num_threads()
    # threads // streams = 1 per stream (threads are bounded by the machine's cores)
    model = fg.compile(path, fg.Config(streams=streams, threads=min(streams, machine_cores())))
    try:
        planned = model.plan.streams.num_streams if model.plan.streams is not None else 1
        assert planned == streams, f"{name}: {streams} streams asked, {planned} planned"
        for _ in range(REPS):
            got = model.run(feeds)
            assert got.keys() == want.keys()
            for k in want:
                assert np.array_equal(got[k], want[k]), \
                    f"{name} streams={streams} {k}: max diff {np.abs(got[k] - want[k]).max()}"
    finally:
        model.close()
        torch.set_num_threads(before)
