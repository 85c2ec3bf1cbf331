"""Build test models without downloads: transformer exports from `transformers` configs with
random weights (torch.onnx.export, opset 17), cached in a temporary folder per test session."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

VOCAB = 1000
SEQ = 16


def _export(module, args, names, path: Path) -> Path:
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), opset_version=17, dynamo=False,
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    module.eval()  # the exporter restores the wrapper's training flag
    return path


def build_transformer_models(folder: Path) -> dict[str, Path]:
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)

    class KwargsWrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    bert = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=2,
                                num_attention_heads=12, intermediate_size=3072,
                                max_position_embeddings=128)).eval()
    gpt2 = GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=768, n_layer=2, n_head=12, n_positions=128,
                                use_cache=False)).eval()
    ids = torch.randint(0, VOCAB, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    out = {}
    for name, model in (("bert", bert), ("gpt2", gpt2)):
        wrapper = KwargsWrapper(model).eval()
        out[name] = _export(wrapper, (ids, mask), ["input_ids", "attention_mask"], folder / f"{name}.onnx")
    return out


def transformer_feeds(seed: int = 0, batch: int = 1, seq: int = SEQ, pad: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    if pad:
        mask[:, -pad:] = 0
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask}


def static_shapes(path, batch: int = 1, seq: int = 16):
    """The export at ``path`` with its (batch, sequence) input axes fixed."""
    import onnx
    m = onnx.load(str(path))
    for inp in m.graph.input:
        for d, v in zip(inp.type.tensor_type.shape.dim, (batch, seq)):
            d.ClearField("dim_param")
            d.dim_value = v
    return m
