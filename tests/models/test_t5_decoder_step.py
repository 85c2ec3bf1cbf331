"""A T5 decoder step (issue 18): decoder stack and LM head with cross-attention to given
encoder states, exported with dynamic target and source lengths
(``model_builders.t5_decoder_step_onnx``, random weights), compiled once and run at several
(target, source) lengths with a padded source position: matches the torch module it was
exported from and onnxruntime (ORT_DISABLE_ALL) at rtol 1e-4."""
import numpy as np
import pytest

import fusegraph as fg
from model_builders import VOCAB, t5_decoder_step_onnx
from oracle import assert_outputs_close, ort_run

NAMES = ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"]


@pytest.fixture(scope="module")
def t5_step(tmp_path_factory):
    return t5_decoder_step_onnx(tmp_path_factory.mktemp("t5") / "t5_decoder_step.onnx")


def test_decoder_step_at_several_lengths(t5_step):
    import torch
    path, step = t5_step
    model = fg.compile(str(path), fg.Config(threads=2))
    rng = np.random.default_rng(0)
    for tgt, src in ((1, 7), (3, 5), (6, 11)):
        mask = np.ones((1, src), np.int64)
        mask[0, -1] = 0
        feeds = {"decoder_input_ids": rng.integers(0, VOCAB, (1, tgt)).astype(np.int64),
                 "encoder_hidden_states": rng.standard_normal((1, src, 64)).astype(np.float32),
                 "encoder_attention_mask": mask}
        got = model.run(feeds)
        assert got["logits"].shape == (1, tgt, VOCAB)
        assert_outputs_close(got, ort_run(str(path), feeds))
        with torch.no_grad():
            want = step(*(torch.from_numpy(feeds[n]) for n in NAMES)).numpy()
        assert_outputs_close(got, {"logits": want})
