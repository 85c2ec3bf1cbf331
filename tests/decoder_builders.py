"""Small decoder blocks exported as the exporters write them (``transformers`` configs, random
He-scaled weights, ``torch.onnx.export`` opset 17): a Llama / Qwen2 block (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU MLP) and a T5 encoder (RMSNorm without mean,
gated GELU), with static or dynamic (batch, sequence) axes."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

VOCAB = 256


def _randomize(model, seed: int = 0):
    """Linear weights N(0, 1/fan_in), embeddings N(0, 0.5), norm scales U(0.5, 1.5), biases
    U(-0.1, 0.1): activations stay O(1) through every block."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() == 2 and "embed" in name or name.endswith("shared.weight") or "relative_attention_bias" in name:
                p.normal_(0, 0.5, generator=g)
            elif p.dim() == 2:
                p.normal_(0, math.sqrt(1.0 / p.shape[1]), generator=g)
            elif leaf == "bias":
                p.uniform_(-0.1, 0.1, generator=g)
            else:
                p.uniform_(0.5, 1.5, generator=g)
    return model.eval()


def _wrapper(model, field):
    import torch

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask), field)

    return Call().eval()


def decoder_onnx(path: Path, kind: str = "llama", dynamic: bool = False, layers: int = 2, hidden: int = 64,
                 heads: int = 4, kv_heads: int = 2, seq: int = 16) -> Path:
    """A ``kind`` (llama | qwen2 | t5) model's ONNX export at ``path`` (output ``hidden``: the last
    hidden state), its (batch, sequence) axes dynamic when ``dynamic``."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                  use_cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "llama":
            model = tf.LlamaModel(tf.LlamaConfig(**common))
        elif kind == "qwen2":
            model = tf.Qwen2Model(tf.Qwen2Config(**common))
        elif kind == "t5":
            model = tf.T5EncoderModel(tf.T5Config(vocab_size=VOCAB, d_model=hidden, d_kv=hidden // heads,
                                                  d_ff=2 * hidden, num_layers=layers, num_heads=heads,
                                                  feed_forward_proj="gated-gelu", use_cache=False))
        else:
            raise ValueError(kind)
    wrapper = _wrapper(_randomize(model), "last_hidden_state")
    ids = torch.randint(0, VOCAB, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    names = ["input_ids", "attention_mask"]
    axes = {n: {0: "batch", 1: "seq"} for n in names} if dynamic else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (ids, mask), str(path), opset_version=17, dynamo=False, input_names=names,
                          output_names=["hidden"], dynamic_axes=axes)
    return path


def decoder_feeds(seed: int = 0, batch: int = 1, seq: int = 16, pad: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    if pad:
        mask[:, -pad:] = 0
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask}
