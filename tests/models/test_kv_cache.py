"""GPT-2 with its KV cache (issue 18): an LM step exported with dynamic sequence and past
lengths (``model_builders.gpt2_kv_cache_onnx``, random weights), compiled once, and driven from
Python for a greedy generation: the prompt with an empty cache, then one token a step with the
cache the previous step returned. Each step's logits and cache match transformers' own cached
forward and onnxruntime (ORT_DISABLE_ALL), and so do the tokens chosen."""
import numpy as np
import pytest

import fusegraph as fg
from model_builders import VOCAB, cache_keyword, cache_tensors, gpt2_kv_cache_onnx
from oracle import assert_outputs_close, ort_run

LAYERS, HEADS, HIDDEN = 2, 4, 64
OUTPUTS = ["logits"] + [f"present_{i}" for i in range(2 * LAYERS)]


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory):
    return gpt2_kv_cache_onnx(tmp_path_factory.mktemp("kv") / "gpt2_kv.onnx", LAYERS, HIDDEN, HEADS)


def _transformers_steps(model, prompt, tokens):
    """Logits of the last position at each step and the final cache, from transformers."""
    import torch
    key = cache_keyword(model)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(prompt), use_cache=True)
        logits = [out.logits[0, -1].numpy()]
        for t in tokens:
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            out = model(input_ids=torch.tensor([[t]]), use_cache=True, **{key: cache})
            logits.append(out.logits[0, -1].numpy())
    return logits, [x.numpy() for x in cache_tensors(out)]


def test_greedy_generation_with_kv_cache(kv_model):
    path, torch_model = kv_model
    model = fg.compile(str(path), fg.Config(threads=2))
    prompt = np.random.default_rng(0).integers(0, VOCAB, (1, 6)).astype(np.int64)
    past = [np.zeros((1, HEADS, 0, HIDDEN // HEADS), np.float32) for _ in range(2 * LAYERS)]
    cur, tokens, logits = prompt, [], []
    for _ in range(4):                          # the prompt, then three generated tokens
        feeds = {"input_ids": cur, "attention_mask": np.ones((1, prompt.shape[1] + len(tokens)), np.int64)}
        feeds.update({f"past_{i}": p for i, p in enumerate(past)})
        got = model.run(feeds)
        assert_outputs_close(got, ort_run(str(path), feeds), rtol=1e-4)
        logits.append(got["logits"][0, -1])
        past = [got[f"present_{i}"] for i in range(2 * LAYERS)]
        tokens.append(int(got["logits"][0, -1].argmax()))
        cur = np.array([[tokens[-1]]], np.int64)
    want_logits, want_cache = _transformers_steps(torch_model, prompt, tokens[:-1])
    for step, (a, b) in enumerate(zip(logits, want_logits)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max(), err_msg=f"step {step}")
        assert int(a.argmax()) == int(b.argmax()), f"step {step}: greedy token differs"
    for i, (a, b) in enumerate(zip(past, want_cache)):
        assert a.shape == b.shape == (1, HEADS, prompt.shape[1] + 3, HIDDEN // HEADS), (a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"present_{i}")
