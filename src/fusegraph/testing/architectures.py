"""A broad architecture zoo, built by script: ONNX exports of the architectures users deploy.

Each entry is a recipe: a model from a ``transformers`` config (or plain torch, for
MobileNetV3 and the recurrent nets) at a small-but-realistic size, with random weights, wrapped
so it is called with keyword arguments and returns its logits (or last hidden state), exported
at batch 1 with static shapes (``torch.onnx.export(..., dynamo=False, opset_version=17)``).
Nothing is downloaded: no weights, no tokenizer, no torchvision.

Random weights, drawn from a seeded generator (``randomize``): the defaults of most
``transformers`` models (normal 0.02, layer scales of 1e-6, zero-initialised GRN) keep
activations near zero or make blocks the identity, so a wrong kernel would hide. Convolutions
get He-scaled weights, linear layers 1/sqrt(fan-in), norms weights in [0.5, 1.5], layer
scales in [0.5, 1], embeddings and tables N(0, 0.5); BatchNorm statistics are those of one
batch of random inputs (a calibrated BN at batch 1). The recurrent nets keep torch's default
initialisation, which already keeps their states O(1).

Exports are cached in a folder (``build(name, cache)``; default ``$FUSEGRAPH_ZOO_CACHE`` or
``~/.cache/fusegraph/zoo``) as ``<name>-<key>.onnx`` beside ``<name>-<key>.json``, where the
key hashes the recipe: the entry's configuration and inputs, the source of its builder and
of the weight initialisation, and the torch / transformers / onnx versions. The manifest
holds the file's SHA-256: an entry whose file does not match it is corrupt, and is rebuilt
(``on_corrupt="rebuild"``, the default) or refused with ``ModelLoadError``
(``on_corrupt="refuse"``).

Every export is checked when it is built: onnxruntime with ORT_DISABLE_ALL (an independent
oracle) against the PyTorch module on the same random inputs (seed 0 and seed 1), every
output element within ``|ort - torch| <= 1e-4 * |torch| + 1e-4 * max|torch|``: fp32 rtol
1e-4, and an absolute tolerance of 1e-4 relative to the output's scale, because two correct
fp32 summation orders of a K-term product differ by about eps * sqrt(K) * (the terms' scale),
which for an element near zero is no fraction of that element. The outputs must also depend
on the input (relative L2 between the two seeds' outputs above 1e-3): random weights too small
would make the output a constant and every check vacuous. An export that fails either check
raises ``ZooBuildError`` and is not kept.

    python -m fusegraph.testing.architectures --build-all [--cache DIR] [--models a,b] [--list]

This module is a test and benchmark instrument: the library never imports it; torch,
transformers and onnxruntime are imported inside the functions that need them.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import FusegraphError, ModelLoadError, UsageError

OPSET = 17
CHECK_RTOL = 1e-4
CHECK_ATOL_OF_SCALE = 1e-4
MIN_INPUT_SENSITIVITY = 1e-3
TEXT_PAD = 8          # the last positions of a text input's attention mask are padding


class ZooBuildError(FusegraphError):
    """A zoo entry could not be exported, or its export disagrees with PyTorch."""


@dataclass(frozen=True)
class InputSpec:
    """One model input: ``kind`` is "float" (N(0, 1)), "ids" (integers in [0, high)) or
    "mask" (int64 ones, the last ``TEXT_PAD`` positions 0)."""
    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    high: int = 0


@dataclass(frozen=True)
class Entry:
    name: str
    source: str                     # where the architecture comes from, in words
    builder: Callable[..., object]  # builder(**config) -> torch module taking the inputs by name
    config: dict = field(default_factory=dict)
    inputs: tuple[InputSpec, ...] = ()
    outputs: tuple[str, ...] = ("logits",)


# ----- weights ---------------------------------------------------------------------------------

def randomize(module, seed: int = 0, calibration_inputs: dict | None = None):
    """Random weights that keep activations O(1) (see the module docstring); BatchNorm
    statistics from one train-mode pass over ``calibration_inputs`` (a batch). Returns the
    module in eval mode."""
    import torch
    nn = torch.nn
    g = torch.Generator().manual_seed(seed)
    handled: set[int] = set()
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.RNNBase,)):
                handled.update(id(p) for p in m.parameters(recurse=False))
                continue
            own = list(m.parameters(recurse=False))
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                w = _weight_of(m)
                if w is not None:
                    fan_in = w.shape[1] * math.prod(w.shape[2:])
                    w.normal_(0, math.sqrt(2.0 / fan_in), generator=g)
            elif isinstance(m, nn.Linear):
                m.weight.normal_(0, math.sqrt(1.0 / m.in_features), generator=g)
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0, 0.5, generator=g)
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.uniform_(0.5, 1.0, generator=g)
            elif _is_norm(m):
                for p in own:
                    if p.ndim == 1 and p is getattr(m, "weight", None):
                        p.uniform_(0.5, 1.5, generator=g)
            else:
                continue
            for name, p in m.named_parameters(recurse=False):
                if name.endswith("bias"):
                    p.uniform_(-0.1, 0.1, generator=g)
                handled.add(id(p))
            handled.update(id(p) for p in own)
        for name, p in module.named_parameters():
            if id(p) in handled:
                continue
            leaf = name.rsplit(".", 1)[-1].lower()
            if "scale" in leaf or "lambda" in leaf or leaf == "gamma":
                p.uniform_(0.5, 1.0, generator=g)
            elif leaf.endswith("bias") or leaf == "beta":
                p.uniform_(-0.1, 0.1, generator=g)
            elif p.ndim >= 2 and p.shape[-1] > 1 and "weight" in leaf:
                p.normal_(0, math.sqrt(1.0 / p.shape[-1]), generator=g)
            else:                               # position embeddings, class tokens, bias tables
                p.normal_(0, 0.5, generator=g)
        for m in module.modules():       # T5 scales no attention logit: its own init puts 1/sqrt(d_kv) in q
            if hasattr(m, "key_value_proj_dim") and isinstance(getattr(m, "q", None), nn.Linear):
                m.q.weight.mul_(m.key_value_proj_dim ** -0.5)
        bns = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if bns:
            if calibration_inputs is None:
                raise UsageError("randomize: a model with BatchNorm needs calibration_inputs")
            for m in bns:
                m.reset_running_stats()
                m.momentum = None              # a cumulative average over the one batch
            module.train()(**calibration_inputs)
            for m in bns:
                m.momentum = 0.1
    return module.eval()


def _weight_of(conv):
    """A convolution's weight tensor, or its weight-norm direction (wav2vec2's positional conv)."""
    import torch
    parametrized = getattr(conv, "parametrizations", None)
    if parametrized is not None and "weight" in parametrized:
        return parametrized.weight.original1
    return conv.weight if isinstance(conv.weight, torch.nn.Parameter) else None


def _is_norm(m) -> bool:
    import torch
    nn = torch.nn
    if isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d)):
        return True
    name = type(m).__name__.lower()
    return "layernorm" in name or "rmsnorm" in name or name.endswith("norm")


# ----- the wrapper -----------------------------------------------------------------------------

def keyword_call(model, input_names: tuple[str, ...], outputs: tuple[str, ...]):
    """A module whose forward takes the inputs positionally (as the exporter passes them), calls
    ``model`` with them as keyword arguments, and returns the named output fields."""
    import torch

    class KeywordCall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(input_names, args)))
            if isinstance(out, torch.Tensor):
                return out
            got = tuple(out[k] if isinstance(out, dict) else getattr(out, k) for k in outputs)
            return got[0] if len(got) == 1 else got

    return KeywordCall().eval()


# ----- builders (each takes its entry's config as keyword arguments) -----------------------------

def _hf(model_class: str, config_class: str, **config):
    import transformers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = getattr(transformers, config_class)(**config)
        return getattr(transformers, model_class)(cfg)


def build_hf(model_class: str, config_class: str, encoder_only: bool = False, **config):
    """A ``transformers`` model from its config; ``encoder_only`` keeps ``get_encoder()``."""
    model = _hf(model_class, config_class, **config)
    return model.get_encoder() if encoder_only else model


def build_mobilenet_v3(num_classes: int = 1000, width: float = 1.0):
    """MobileNetV3-Large as torchvision builds it (hardswish, squeeze-excite with hardsigmoid,
    BN eps 1e-3), written here in plain torch: no torchvision."""
    import torch
    nn = torch.nn

    def divisible(v: float, d: int = 8) -> int:
        new = max(d, int(v + d / 2) // d * d)
        return new + d if new < 0.9 * v else new

    def cna(cin, cout, k, stride=1, groups=1, act=None):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
        return layers + ([act(inplace=True)] if act is not None else [])

    class SqueezeExcite(nn.Module):
        def __init__(self, c):
            super().__init__()
            squeeze = divisible(c // 4)
            self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            s = nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(s))))
            return x * s

    class InvertedResidual(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, stride):
            super().__init__()
            layers = cna(cin, exp, 1, act=act) if exp != cin else []
            layers += cna(exp, exp, k, stride, groups=exp, act=act)
            if se:
                layers.append(SqueezeExcite(exp))
            layers += cna(exp, cout, 1)
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.residual else self.block(x)

    RE, HS = nn.ReLU, nn.Hardswish
    settings = [(16, 3, 16, 16, False, RE, 1), (16, 3, 64, 24, False, RE, 2), (24, 3, 72, 24, False, RE, 1),
                (24, 5, 72, 40, True, RE, 2), (40, 5, 120, 40, True, RE, 1), (40, 5, 120, 40, True, RE, 1),
                (40, 3, 240, 80, False, HS, 2), (80, 3, 200, 80, False, HS, 1), (80, 3, 184, 80, False, HS, 1),
                (80, 3, 184, 80, False, HS, 1), (80, 3, 480, 112, True, HS, 1), (112, 3, 672, 112, True, HS, 1),
                (112, 5, 672, 160, True, HS, 2), (160, 5, 960, 160, True, HS, 1), (160, 5, 960, 160, True, HS, 1)]

    def w(c):
        return divisible(c * width)

    layers = cna(3, w(16), 3, 2, act=HS)
    for cin, k, exp, cout, se, act, stride in settings:
        layers.append(InvertedResidual(w(cin), k, w(exp), w(cout), se, act, stride))
    last = w(160)
    layers += cna(last, 6 * last, 1, act=HS)

    class MobileNetV3(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Linear(6 * last, 1280), nn.Hardswish(inplace=True),
                                            nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, pixel_values):
            x = nn.functional.adaptive_avg_pool2d(self.features(pixel_values), 1)
            return self.classifier(torch.flatten(x, 1))

    return MobileNetV3()


def build_recurrent(cell: str, features: int, hidden: int, layers: int, bidirectional: bool, classes: int):
    """A frame classifier over a sequence of feature vectors: a stacked LSTM or GRU (torch's own
    module, exported as ONNX LSTM / GRU) and a linear layer per frame."""
    import torch
    nn = torch.nn

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            rnn = nn.LSTM if cell == "lstm" else nn.GRU
            self.rnn = rnn(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
            self.head = nn.Linear(hidden * (2 if bidirectional else 1), classes)

        def forward(self, input_features):
            return self.head(self.rnn(input_features)[0])

    return Recurrent()


# ----- the zoo ---------------------------------------------------------------------------------

def _image(size: int = 224, channels: int = 3, name: str = "pixel_values") -> tuple[InputSpec, ...]:
    return (InputSpec(name, (1, channels, size, size)),)


def _text(seq: int, vocab: int, mask: bool = True) -> tuple[InputSpec, ...]:
    ids = InputSpec("input_ids", (1, seq), "ids", vocab)
    return (ids, InputSpec("attention_mask", (1, seq), "mask")) if mask else (ids,)


def _hf_entry(name, source, model_class, config_class, inputs, outputs=("logits",), **config):
    return Entry(name, source, build_hf, {"model_class": model_class, "config_class": config_class, **config},
                 inputs, outputs)


_BERT_BASE = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
VOCAB = 30522

ENTRIES: tuple[Entry, ...] = (
    # ----- convolutional image classifiers
    _hf_entry("resnet18", "transformers ResNetConfig (ResNet-18: basic blocks 2-2-2-2)", "ResNetForImageClassification",
              "ResNetConfig", _image(), layer_type="basic", depths=[2, 2, 2, 2],
              hidden_sizes=[64, 128, 256, 512], embedding_size=64, downsample_in_first_stage=False),
    _hf_entry("mobilenet_v1", "transformers MobileNetV1Config (1.0, TF 'same' padding)",
              "MobileNetV1ForImageClassification", "MobileNetV1Config", _image(), tf_padding=True),
    _hf_entry("mobilenet_v2", "transformers MobileNetV2Config (1.0, 224, TF 'same' padding: the config's default)", "MobileNetV2ForImageClassification",
              "MobileNetV2Config", _image()),
    Entry("mobilenet_v3", "plain torch, torchvision's MobileNetV3-Large (hardswish, squeeze-excite)",
          build_mobilenet_v3, {"num_classes": 1000}, _image()),
    _hf_entry("efficientnet_b0", "transformers EfficientNetConfig (B0: width 1.0, depth 1.0, 224)",
              "EfficientNetForImageClassification", "EfficientNetConfig", _image(), width_coefficient=1.0,
              depth_coefficient=1.0, image_size=224, hidden_dim=1280),
    _hf_entry("regnety_800mf", "transformers RegNetConfig (RegNetY-800MF: grouped 3x3, squeeze-excite)",
              "RegNetForImageClassification", "RegNetConfig", _image(), embedding_size=32,
              hidden_sizes=[64, 128, 320, 768], depths=[1, 3, 8, 2], groups_width=16, layer_type="y"),
    _hf_entry("convnext_pico", "transformers ConvNextConfig (ConvNeXt-P: 2-2-6-2, dims 64..512, layer scale)",
              "ConvNextForImageClassification", "ConvNextConfig", _image(), depths=[2, 2, 6, 2],
              hidden_sizes=[64, 128, 256, 512]),
    _hf_entry("convnextv2_atto", "transformers ConvNextV2Config (ConvNeXt-V2-A: 2-2-6-2, dims 40..320, GRN)",
              "ConvNextV2ForImageClassification", "ConvNextV2Config", _image(), depths=[2, 2, 6, 2],
              hidden_sizes=[40, 80, 160, 320]),
    # ----- vision transformers and hybrids
    _hf_entry("deit_small_6l", "transformers DeiTConfig (DeiT-S: 384 wide, 6 heads, patch 16, distillation "
              "token; 6 of 12 layers)", "DeiTForImageClassificationWithTeacher", "DeiTConfig", _image(),
              hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536),
    _hf_entry("dinov2_small", "transformers Dinov2Config (DINOv2-S: 384 wide, 6 heads, patch 14, layer scale; 4 layers)",
              "Dinov2Model", "Dinov2Config", _image(), outputs=("pooler_output",), hidden_size=384,
              num_hidden_layers=4, num_attention_heads=6, image_size=224),
    _hf_entry("beit_small", "transformers BeitConfig (384 wide, 6 layers, relative position bias, layer scale)",
              "BeitForImageClassification", "BeitConfig", _image(), hidden_size=384, num_hidden_layers=6,
              num_attention_heads=6, intermediate_size=1536, use_relative_position_bias=True,
              use_mean_pooling=True, layer_scale_init_value=0.1),
    _hf_entry("swin_micro", "transformers SwinConfig (Swin, window 7, 224: 2-2-4-2, embed 64, heads 2..16)",
              "SwinForImageClassification", "SwinConfig", _image(), embed_dim=64, depths=[2, 2, 4, 2],
              num_heads=[2, 4, 8, 16]),
    _hf_entry("mobilevit_small", "transformers MobileViTConfig (MobileViT-S, 256x256)",
              "MobileViTForImageClassification", "MobileViTConfig", _image(256)),
    _hf_entry("segformer_b0", "transformers SegformerConfig (MiT-B0 + all-MLP head, 256x256, 150 classes)",
              "SegformerForSemanticSegmentation", "SegformerConfig", _image(256), num_labels=150),
    _hf_entry("yolos_tiny_6l", "transformers YolosConfig (YOLOS-Ti: 192 wide, 100 detection tokens, 256x256; 6 of "
              "12 layers)", "YolosForObjectDetection", "YolosConfig", _image(256), outputs=("logits", "pred_boxes"),
              hidden_size=192, num_hidden_layers=6, num_attention_heads=3, intermediate_size=768,
              image_size=[256, 256]),
    # ----- speech
    _hf_entry("wav2vec2_base", "transformers Wav2Vec2Config (base: GroupNorm feature encoder, 2 of 12 layers, 1 s of 16 kHz)",
              "Wav2Vec2Model", "Wav2Vec2Config", (InputSpec("input_values", (1, 16000)),),
              outputs=("last_hidden_state",), num_hidden_layers=2),
    _hf_entry("hubert_base", "transformers HubertConfig (LayerNorm feature encoder, pre-norm, 2 layers, 1 s)",
              "HubertModel", "HubertConfig", (InputSpec("input_values", (1, 16000)),),
              outputs=("last_hidden_state",), num_hidden_layers=2, feat_extract_norm="layer",
              do_stable_layer_norm=True),
    _hf_entry("whisper_tiny_encoder", "transformers WhisperConfig (whisper-tiny encoder, 4 layers, 3 s: 300 mel frames)",
              "WhisperModel", "WhisperConfig", (InputSpec("input_features", (1, 80, 300)),),
              outputs=("last_hidden_state",), encoder_only=True, max_source_positions=150),
    # ----- text encoders (sequence 128)
    _hf_entry("bert_base_4l", "transformers BertConfig (BERT-base, 4 of 12 layers, seq 128)", "BertModel",
              "BertConfig", _text(128, VOCAB), outputs=("last_hidden_state",), num_hidden_layers=4,
              **_BERT_BASE),
    _hf_entry("roberta_base_4l", "transformers RobertaConfig (RoBERTa-base, 4 of 12 layers, seq 128, classifier)",
              "RobertaForSequenceClassification", "RobertaConfig", _text(128, 50265), vocab_size=50265,
              max_position_embeddings=514, pad_token_id=1, num_hidden_layers=4, **_BERT_BASE),
    _hf_entry("distilbert_4l", "transformers DistilBertConfig (distilbert-base, 4 of 6 layers, seq 128)",
              "DistilBertModel", "DistilBertConfig", _text(128, VOCAB), outputs=("last_hidden_state",), n_layers=4),
    _hf_entry("albert_base", "transformers AlbertConfig (albert-base-v2: 768 wide, 128 embedding, shared layer run 4 times, seq 128)",
              "AlbertModel", "AlbertConfig", _text(128, 30000), outputs=("last_hidden_state",), hidden_size=768,
              embedding_size=128, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=4),
    _hf_entry("t5_small_encoder", "transformers T5Config (flan-t5-small encoder: gated-GELU, relative bias, 8 layers, seq 128)",
              "T5EncoderModel", "T5Config", _text(128, 32128), outputs=("last_hidden_state",), d_model=512,
              d_kv=64, d_ff=1024, num_layers=8, num_heads=6, feed_forward_proj="gated-gelu", use_cache=False),
    _hf_entry("bart_base_encoder", "transformers BartConfig (bart-base encoder: 768 wide, 3 of 6 layers, seq 128)",
              "BartModel", "BartConfig", _text(128, 50265), outputs=("last_hidden_state",), encoder_only=True,
              d_model=768, encoder_layers=3, decoder_layers=1, encoder_attention_heads=12,
              encoder_ffn_dim=3072, use_cache=False),
    # ----- decoders (sequence 128, no KV cache)
    _hf_entry("gpt2_4l", "transformers GPT2Config (gpt2: 768 wide, 4 of 12 layers, seq 128)", "GPT2Model",
              "GPT2Config", _text(128, 50257), outputs=("last_hidden_state",), n_layer=4, use_cache=False),
    _hf_entry("llama_gqa", "transformers LlamaConfig (RMSNorm, rotary, SwiGLU, GQA 8 heads / 2 KV heads; "
              "512 wide, 4 layers, vocab 8192, seq 128)", "LlamaForCausalLM", "LlamaConfig", _text(128, 8192),
              vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, use_cache=False),
    _hf_entry("qwen2_gqa", "transformers Qwen2Config (q/k/v bias, rotary, SwiGLU, GQA 8 / 2; 512 wide, 4 layers, "
              "vocab 8192, seq 128)", "Qwen2ForCausalLM", "Qwen2Config", _text(128, 8192), vocab_size=8192,
              hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=512, use_cache=False),
    # ----- recurrent (plain torch)
    Entry("lstm_2l", "plain torch nn.LSTM (2 layers, 512 hidden, 100 frames of 80 features, 40 classes per frame)",
          build_recurrent, {"cell": "lstm", "features": 80, "hidden": 512, "layers": 2, "bidirectional": False,
                            "classes": 40}, (InputSpec("input_features", (1, 100, 80)),)),
    Entry("gru_bi", "plain torch nn.GRU (2 layers, bidirectional, 256 hidden, 100 frames of 80 features)",
          build_recurrent, {"cell": "gru", "features": 80, "hidden": 256, "layers": 2, "bidirectional": True,
                            "classes": 40}, (InputSpec("input_features", (1, 100, 80)),)),
)


def zoo_names() -> list[str]:
    return [e.name for e in ENTRIES]


def entry(name: str) -> Entry:
    for e in ENTRIES:
        if e.name == name:
            return e
    raise UsageError(f"no zoo architecture {name!r}; known: {', '.join(zoo_names())}")


# ----- inputs ----------------------------------------------------------------------------------

def feeds(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``name`` (the export's input names, shapes and dtypes)."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in entry(name).inputs:
        if spec.kind == "float":
            out[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
        elif spec.kind == "ids":
            out[spec.name] = rng.integers(0, spec.high, spec.shape).astype(np.int64)
        elif spec.kind == "mask":
            mask = np.ones(spec.shape, np.int64)
            mask[..., -TEXT_PAD:] = 0
            out[spec.name] = mask
        else:
            raise UsageError(f"{name}: input {spec.name} has an unknown kind {spec.kind!r}")
    return out


def _calibration_batch(e: Entry, batch: int = 8) -> dict:
    """A batch of random inputs for BatchNorm statistics (seed 1000+)."""
    import torch
    rows = [feeds(e.name, 1000 + i) for i in range(batch)]
    return {k: torch.from_numpy(np.concatenate([r[k] for r in rows])) for k in rows[0]}


# ----- build, cache and check --------------------------------------------------------------------

def default_cache() -> Path:
    return Path(os.environ.get("FUSEGRAPH_ZOO_CACHE") or Path.home() / ".cache" / "fusegraph" / "zoo")


def recipe(name: str) -> dict:
    """Everything the export depends on; its hash is the cache key."""
    import onnx
    import torch
    import transformers
    e = entry(name)
    return {"name": e.name, "builder": e.builder.__name__, "config": e.config,
            "inputs": [[s.name, list(s.shape), s.kind, s.high] for s in e.inputs], "outputs": list(e.outputs),
            "opset": OPSET, "text_pad": TEXT_PAD,
            "code": hashlib.sha256("".join(inspect.getsource(f) for f in (
                e.builder, randomize, keyword_call, module, _hf, _calibration_batch, feeds)).encode()).hexdigest(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "onnx": onnx.__version__}}


def recipe_key(name: str) -> str:
    return hashlib.sha256(json.dumps(recipe(name), sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_paths(name: str, cache: str | Path | None = None) -> tuple[Path, Path]:
    """(export, manifest) paths of ``name`` in ``cache``."""
    folder = Path(cache) if cache is not None else default_cache()
    stem = f"{name}-{recipe_key(name)}"
    return folder / f"{stem}.onnx", folder / f"{stem}.json"


def manifest(name: str, cache: str | Path | None = None) -> dict:
    """The manifest of a cached export (``build`` first)."""
    return json.loads(cached_paths(name, cache)[1].read_text())


def build(name: str, cache: str | Path | None = None, on_corrupt: str = "rebuild") -> Path:
    """The checked ONNX export of ``name``, from ``cache`` or built into it.

    A cached file whose SHA-256 differs from its manifest's (or a manifest that cannot be
    read) is corrupt: ``on_corrupt="rebuild"`` builds it again, ``"refuse"`` raises
    ``ModelLoadError``. A new export that fails its check raises ``ZooBuildError``."""
    if on_corrupt not in ("rebuild", "refuse"):
        raise UsageError(f"on_corrupt must be 'rebuild' or 'refuse', not {on_corrupt!r}")
    path, meta = cached_paths(name, cache)
    if path.exists() or meta.exists():
        problem = _corruption(path, meta)
        if problem is None:
            return path
        if on_corrupt == "refuse":
            raise ModelLoadError(f"zoo cache entry {path} is corrupt ({problem}); delete it or build with "
                                 f"on_corrupt='rebuild'")
        warnings.warn(f"zoo cache entry {path} is corrupt ({problem}): rebuilding it", stacklevel=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = _export_and_check(name, path)
    meta.write_text(json.dumps(record, indent=1, sort_keys=True))
    return path


def _corruption(path: Path, meta: Path) -> str | None:
    if not path.exists():
        return "the export is missing"
    try:
        want = json.loads(meta.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest cannot be read: {type(exc).__name__}"
    got = _sha256(path)
    return None if got == want else f"SHA-256 {got[:12]}... differs from the manifest's {want[:12]}..."


def module(name: str):
    """The entry's PyTorch module with its random weights, wrapped as it is exported (inputs
    positional in the entry's order, passed on as keywords; the entry's outputs returned)."""
    import torch
    e = entry(name)
    torch.manual_seed(0)
    model = e.builder(**e.config)
    if hasattr(model, "config") and hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    randomize(model, seed=0, calibration_inputs=_calibration_batch(e) if has_bn else None)
    return keyword_call(model, tuple(s.name for s in e.inputs), e.outputs)


def _export_and_check(name: str, path: Path) -> dict:
    import onnx
    import torch
    e = entry(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapper = module(name)
            names = tuple(s.name for s in e.inputs)
            args = tuple(torch.from_numpy(v) for v in feeds(name, 0).values())
            tmp = path.with_suffix(f".tmp{os.getpid()}.onnx")
            t0 = time.perf_counter()
            torch.onnx.export(wrapper, args, str(tmp), opset_version=OPSET, dynamo=False,
                              input_names=list(names), output_names=list(e.outputs))
            export_s = time.perf_counter() - t0
            wrapper.eval()       # the exporter restores the training flag it found: keep eval
    except Exception as exc:   # any exporter failure is this entry's build error
        raise ZooBuildError(f"{name}: export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:400]}") \
            from exc
    try:
        check = check_export(name, wrapper, tmp)
    except ZooBuildError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    proto = onnx.load(str(path), load_external_data=False)
    params = sum(p.numel() for p in wrapper.parameters())
    ops: dict[str, int] = {}
    for node in proto.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"name": name, "source": e.source, "recipe": recipe(name), "key": recipe_key(name),
            "sha256": _sha256(path), "bytes": path.stat().st_size, "parameters": int(params),
            "nodes": len(proto.graph.node), "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
            "inputs": {s.name: [list(s.shape), s.kind] for s in e.inputs}, "outputs": list(e.outputs),
            "export_s": round(export_s, 2), "check": check,
            "built": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def check_export(name: str, torch_module, path: Path) -> dict:
    """The export at ``path`` against ``torch_module`` through onnxruntime ORT_DISABLE_ALL, on the
    inputs of seeds 0 and 1 (see the module docstring for the tolerance); raises
    ``ZooBuildError`` on a mismatch or an output that does not depend on its input."""
    import onnxruntime as ort
    import torch
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:   # an export onnxruntime cannot load fails its check
        raise ZooBuildError(f"{name}: onnxruntime cannot load the export: {str(exc).splitlines()[0][:400]}") \
            from exc
    out_names = [o.name for o in sess.get_outputs()]
    runs = []
    worst = {}
    for seed in (0, 1):
        f = feeds(name, seed)
        with torch.no_grad():
            want = torch_module(*(torch.from_numpy(v) for v in f.values()))
        want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
        got = sess.run(out_names, f)
        for out_name, w, g in zip(out_names, want, got):
            if w.shape != g.shape:
                raise ZooBuildError(f"{name}: output {out_name} has shape {g.shape} in onnxruntime, "
                                    f"{w.shape} in PyTorch")
            scale = float(np.abs(w).max()) or 1.0
            excess = np.abs(g.astype(np.float64) - w) - (CHECK_RTOL * np.abs(w) + CHECK_ATOL_OF_SCALE * scale)
            if not np.isfinite(g).all() or excess.max() > 0:
                i = np.unravel_index(int(np.argmax(excess)), w.shape)
                raise ZooBuildError(
                    f"{name}: output {out_name} (seed {seed}) differs between onnxruntime ORT_DISABLE_ALL and "
                    f"PyTorch at {tuple(int(x) for x in i)}: {g[i]!r} vs {w[i]!r} (output scale {scale:.3g}; "
                    f"allowed {CHECK_RTOL:g} x |torch| + {CHECK_ATOL_OF_SCALE:g} x scale)")
            err = float(np.abs(g.astype(np.float64) - w).max() / scale)
            worst[out_name] = max(worst.get(out_name, 0.0), err)
        runs.append(want)
    sensitivity = {}
    for out_name, a, b in zip(out_names, runs[0], runs[1]):
        norm = float(np.linalg.norm(a.astype(np.float64)))
        sensitivity[out_name] = float(np.linalg.norm(a.astype(np.float64) - b)) / (norm or 1.0)
    if max(sensitivity.values()) < MIN_INPUT_SENSITIVITY:
        raise ZooBuildError(f"{name}: the outputs hardly depend on the input (relative L2 between two inputs' "
                            f"outputs {sensitivity}): the random weights are too small")
    rms = {n: float(np.sqrt(np.mean(np.square(a.astype(np.float64))))) for n, a in zip(out_names, runs[0])}
    return {"oracle": "onnxruntime ORT_DISABLE_ALL", "seeds": [0, 1], "rtol": CHECK_RTOL,
            "atol_of_scale": CHECK_ATOL_OF_SCALE, "max_abs_err_over_scale": worst,
            "input_sensitivity": sensitivity, "output_rms": rms}


def build_all(cache: str | Path | None = None, names: list[str] | None = None, log=print) -> dict[str, Path | str]:
    """Build every entry (or ``names``); a failure is recorded as its message and the rest go on."""
    out: dict[str, Path | str] = {}
    for name in names or zoo_names():
        t0 = time.perf_counter()
        try:
            out[name] = build(name, cache)
            log(f"{name}: {out[name]} ({time.perf_counter() - t0:.1f} s)")
        except FusegraphError as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
            log(f"{name}: FAILED {out[name]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-all", action="store_true", help="build (or find in the cache) every entry")
    ap.add_argument("--models", help="comma-separated entries instead of all")
    ap.add_argument("--cache", help="cache folder (default $FUSEGRAPH_ZOO_CACHE or ~/.cache/fusegraph/zoo)")
    ap.add_argument("--list", action="store_true", help="list the entries and their sources")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else None
    if args.list:
        print("| model | source | parameters | inputs | outputs | ONNX nodes | check: max err / scale |")
        print("|---|---|---:|---|---|---:|---:|")
        for e in ENTRIES:
            if names is None or e.name in names:
                meta = cached_paths(e.name, args.cache)[1]
                m = json.loads(meta.read_text()) if meta.exists() else None
                inputs = ", ".join(f"{s.name} {'x'.join(map(str, s.shape))} {s.kind}" for s in e.inputs)
                cells = [e.name, e.source, f"{m['parameters'] / 1e6:.1f} M" if m else "not built", inputs,
                         ", ".join(e.outputs), str(m["nodes"]) if m else "",
                         f"{max(m['check']['max_abs_err_over_scale'].values()):.1e}" if m else ""]
                print("| " + " | ".join(cells) + " |")
        return 0
    if not args.build_all and not names:
        ap.error("nothing to do: give --build-all, --models or --list")
    torch_threads(2)
    results = build_all(args.cache, names)
    failed = [n for n, r in results.items() if isinstance(r, str)]
    print(f"{len(results) - len(failed)} built, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def torch_threads(n: int) -> None:
    import torch
    torch.set_num_threads(n)


if __name__ == "__main__":
    sys.exit(main())
