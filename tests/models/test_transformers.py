"""BERT- and GPT-2-style exports (random weights, opset 17) compile and match onnxruntime."""
import pytest

import fusegraph as fg
from model_builders import transformer_feeds
from oracle import assert_outputs_close, ort_run


@pytest.mark.parametrize("name", ["bert", "gpt2"])
@pytest.mark.parametrize("batch, seq", [(1, 16), (2, 7)])
def test_transformer_matches_onnxruntime(transformer_models, name, batch, seq):
    path = str(transformer_models[name])
    feeds = transformer_feeds(seed=batch, batch=batch, seq=seq)
    want = ort_run(path, feeds)
    got = fg.compile(path).run(feeds)
    assert_outputs_close(got, want)
    assert got["last_hidden_state"].std() > 0.1
