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


def build_transformer_models(folder: Path, layers: int = 2, positions: int = 128) -> dict[str, Path]:
    """BERT- and GPT-2-style exports with dynamic (batch, seq) axes, sequences up to ``positions``."""
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)

    class KwargsWrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    bert = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=layers,
                                num_attention_heads=12, intermediate_size=3072,
                                max_position_embeddings=positions)).eval()
    gpt2 = GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=768, n_layer=layers, n_head=12, n_positions=positions,
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


# ----- torch-frontend models (issue 17): small transformers configs and plain-torch CNNs -------

def _kwargs_wrapper(model, names, field="last_hidden_state"):
    import torch

    class KwargsCall(torch.nn.Module):
        """Calls a `transformers` model with keyword arguments and returns one tensor."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return getattr(self.model(**dict(zip(names, args))), field)

    import inspect
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    KwargsCall.forward.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params)
    return KwargsCall().eval()


def small_transformer(name: str, hidden: int = 64, layers: int = 2, heads: int = 4):
    """(module, example args, input names) for bert | gpt2 | vit | t5 at a small config."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if name == "vit":
        cfg = tf.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=hidden,
                           num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden)
        model = tf.ViTModel(cfg, add_pooling_layer=False).eval()
        return _kwargs_wrapper(model, ["pixel_values"]), (torch.randn(1, 3, 32, 32),), ["pixel_values"]
    if name == "bert":
        model = tf.BertModel(tf.BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                                           num_attention_heads=heads, intermediate_size=4 * hidden,
                                           max_position_embeddings=128), add_pooling_layer=False)
    elif name == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(vocab_size=VOCAB, n_embd=hidden, n_layer=layers, n_head=heads,
                                           n_positions=128, use_cache=False))
    elif name == "t5":
        model = tf.T5EncoderModel(tf.T5Config(vocab_size=VOCAB, d_model=hidden, d_kv=hidden // heads,
                                              d_ff=4 * hidden, num_layers=layers, num_heads=heads,
                                              use_cache=False))
    else:
        raise ValueError(name)
    model.eval()
    ids = torch.randint(0, VOCAB, (2, SEQ))
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, -3:] = 0
    names = ["input_ids", "attention_mask"]
    return _kwargs_wrapper(model, names), (ids, mask), names


def _he_init(module, seed: int = 0):
    """He-scaled conv / linear weights and BN statistics that keep activations O(1)."""
    import math

    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.Conv2d):
                fan_in = m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
                m.weight.normal_(0, math.sqrt(2.0 / fan_in), generator=g)
                if m.bias is not None:
                    m.bias.uniform_(-0.1, 0.1, generator=g)
            elif isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, math.sqrt(1.0 / m.in_features), generator=g)
                m.bias.uniform_(-0.1, 0.1, generator=g)
            elif isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.0, generator=g)
                m.bias.uniform_(-0.1, 0.1, generator=g)
        # BN statistics from one batch of random images, so every layer's input is O(1) (not
        # saturated): logits then depend on the input
        bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        module.train()(torch.randn(8, 3, 64, 64, generator=g))
        for m in bns:
            m.momentum = 0.1
    return module.eval()


def resnet50_style(num_classes: int = 10, width: int = 16, blocks=(3, 4, 6, 3)):
    """A ResNet-50-style network (bottlenecks 1x1-3x3-1x1, expansion 4) in plain torch."""
    import torch
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
            self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return self.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = width
    for i, n in enumerate(blocks):
        mid = width * 2 ** i
        for j in range(n):
            layers.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return _he_init(nn.Sequential(*layers))


def mobilenetv2_style(num_classes: int = 10, width: float = 0.5):
    """A MobileNetV2-style network (inverted residuals, depthwise 3x3, ReLU6) in plain torch."""
    import torch
    nn = torch.nn

    def cbr(cin, cout, k, s, groups=1, act=True):
        mods = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return mods + ([nn.ReLU6(inplace=True)] if act else [])

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hid = cin * expand
            mods = (cbr(cin, hid, 1, 1) if expand != 1 else []) + cbr(hid, hid, 3, stride, groups=hid) \
                + cbr(hid, cout, 1, 1, act=False)
            self.block = nn.Sequential(*mods)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.residual else self.block(x)

    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]
    c = int(32 * width)
    layers = cbr(3, c, 3, 2)
    for t, ch, n, s in settings:
        cout = max(8, int(ch * width))
        for i in range(n):
            layers.append(InvertedResidual(c, cout, s if i == 0 else 1, t))
            c = cout
    layers += cbr(c, 1280 // 2, 1, 1) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                                         nn.Linear(1280 // 2, num_classes)]
    return _he_init(nn.Sequential(*layers))


def mobilenetv2_onnx(path, width: float = 1.0, num_classes: int = 1000, size: int = 224) -> Path:
    """``mobilenetv2_style`` (random He weights, BatchNorm statistics randomised, eval mode)
    exported to ONNX (opset 17): Conv + BatchNormalization + Clip(0, 6), depthwise 3x3,
    inverted residuals; input ``x`` [1, 3, size, size], output ``logits``."""
    import torch
    torch.manual_seed(0)
    net = mobilenetv2_style(num_classes=num_classes, width=width)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    net.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 3, size, size),), str(path), opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["logits"])
    return Path(path)


def gpt2_kv_cache_onnx(path, layers: int = 2, hidden: int = 64, heads: int = 4):
    """A GPT-2 LM step with its KV cache as graph inputs and outputs, exported with dynamic
    sequence (``seq``), past (``past``) and total (``total``) lengths: inputs ``input_ids``,
    ``attention_mask``, ``past_0..past_{2L-1}`` (key, value per layer, ``[1, heads, past,
    hidden / heads]``); outputs ``logits``, ``present_0..``. Returns (path, the torch model)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=hidden, n_layer=layers, n_head=heads,
                                       n_positions=128)).eval()

    class Step(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=True,
                          **{cache_keyword(self.lm): cache})
            return (out.logits, *cache_tensors(out))

    past = [torch.randn(1, heads, 3, hidden // heads) for _ in range(2 * layers)]
    args = (torch.randint(0, VOCAB, (1, 5)), torch.ones(1, 8, dtype=torch.int64), *past)
    names = ["input_ids", "attention_mask"] + [f"past_{i}" for i in range(2 * layers)]
    outputs = ["logits"] + [f"present_{i}" for i in range(2 * layers)]
    axes = {"input_ids": {1: "seq"}, "attention_mask": {1: "total"}, "logits": {1: "seq"}}
    axes.update({f"past_{i}": {2: "past"} for i in range(2 * layers)})
    axes.update({f"present_{i}": {2: "total"} for i in range(2 * layers)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step(model).eval(), args, str(path), opset_version=17, dynamo=False,
                          input_names=names, output_names=outputs, dynamic_axes=axes)
    return Path(path), model


def cache_keyword(model) -> str:
    """The forward keyword of a transformers model's KV cache (``cache`` from transformers 5.24,
    ``past_key_values`` before)."""
    import inspect
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_tensors(output) -> list:
    """[key_0, value_0, key_1, ...] of the cache a transformers forward returned."""
    cache = getattr(output, "cache", None)
    cache = cache if cache is not None else output.past_key_values
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for k, v in zip(cache.key_cache, cache.value_cache) for t in (k, v)]


def t5_decoder_step_onnx(path, layers: int = 2, hidden: int = 64, heads: int = 4):
    """A T5 decoder step (decoder stack + LM head, no cache: the target so far re-run each
    step, cross-attending to the encoder's states) exported with dynamic target (``tgt``) and
    source (``src``) lengths: inputs ``decoder_input_ids``, ``encoder_hidden_states``,
    ``encoder_attention_mask``; output ``logits``. Returns (path, the torch step module)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=hidden, d_kv=hidden // heads, d_ff=4 * hidden,
                                             num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                                             use_cache=False)).eval()

    class Step(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask):
            h = self.model.decoder(input_ids=decoder_input_ids, encoder_hidden_states=encoder_hidden_states,
                                   encoder_attention_mask=encoder_attention_mask, use_cache=False).last_hidden_state
            if self.model.config.tie_word_embeddings:      # as T5ForConditionalGeneration scales it
                h = h * self.model.model_dim ** -0.5
            return self.model.lm_head(h)

    step = Step(t5).eval()
    args = (torch.randint(0, VOCAB, (1, 4)), torch.randn(1, 7, hidden), torch.ones(1, 7, dtype=torch.int64))
    names = ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    axes = {"decoder_input_ids": {1: "tgt"}, "encoder_hidden_states": {1: "src"}, "encoder_attention_mask": {1: "src"},
            "logits": {1: "tgt"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, args, str(path), opset_version=17, dynamo=False, input_names=names,
                          output_names=["logits"], dynamic_axes=axes)
    return Path(path), step
