"""The nine onnx light models compile, run and match onnxruntime (ORT_DISABLE_ALL), with the
shipped weights (all 0.02) and with random weights (He-scaled, calibrated BN), logits included."""
import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph.testing import zoo
from oracle import assert_outputs_close, ort_run


@pytest.fixture(scope="module", params=zoo.LIGHT_MODELS)
def light(request):
    return request.param, onnx.load(zoo.light_model_path(request.param))


def test_shipped_weights_match_onnxruntime(light):
    """The shipped (constant) weights give logits of up to ~1e10 whose 1000 classes are all
    but equal: the last ulp of a logit (512 at 7e9) decides the softmax, so the probabilities
    are compared only where the logits are small enough for fp32 to rank them; the logits
    themselves always are (relative to their scale)."""
    name, proto = light
    proto = zoo.expose_logits(proto)
    feeds = zoo.random_feeds(proto, seed=1)
    got, want = fg.compile(proto).run(feeds), ort_run(proto, feeds)
    logits = "logits" if "logits" in want else next(iter(want))
    assert_outputs_close({logits: got[logits]}, {logits: want[logits]})
    if np.abs(want[logits]).max() < 10:
        assert_outputs_close(got, want)


def test_random_weights_match_onnxruntime_logits_too(light):
    name, proto = light
    proto = zoo.expose_logits(zoo.random_light_model(name))
    feeds = zoo.random_feeds(proto, seed=1)
    want = ort_run(proto, feeds)
    got = fg.compile(proto).run(feeds)
    # Deep fp32 nets carry float-reassociation noise: allow at most twice the difference
    # between onnxruntime's own optimised and unoptimised runs, when that exceeds atol.
    noise = ort_run(proto, feeds, level="all")
    floor = max(float(np.abs(noise[k] - want[k]).max()) for k in want)
    assert_outputs_close(got, want, atol=max(1e-5, 2 * floor))
    logits = want.get("logits", next(iter(want.values())))  # densenet121 ends without Softmax
    assert logits.std() > 0.1 and abs(logits).max() < 1e3, "random weights must keep logits O(1)"
