"""Decoder fusion rules (``RULES``): the blocks of Llama / Qwen2 / Mistral-style decoders and of
T5, as the exporters write them; kernels in ``ops/fused_decoder.py``, recognisers in
``decoder_forms.py``. Always on: each rewrite computes what the graph computes (up to
float32 rounding: the same products and sums, in float32).

- attention_repeat_kv (47): ``ScaledDotProductAttention`` whose k and v are ``repeat_kv``'s
  ``Reshape(Expand(Unsqueeze(t, 2)))`` (grouped-query attention: each k / v head serves
  ``n`` consecutive query heads) reads t itself with ``kv_repeat = n``: the repeated heads are
  never materialised (the attention's products broadcast k / v over the group).
- rotary_embedding (36): ``x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin`` (the Slices, Neg
  and Concat of ``rotate_half``) -> ``RotaryEmbedding``; when x is a projection's head split
  ``Transpose(Reshape(p, [B, S, H, D]), [0, 2, 1, 3])`` read only by the rotation, the rotation
  reads p (``heads = H``) and the head split moves after it, where the attention takes it in.
- rms_norm (29: after layer_norm, as a LayerNorm is the RMS norm of ``x - mean``):
  ``x * (1 / sqrt(mean(x^2) + eps)) [* gamma]`` (or ``x / sqrt(..)``, or ``Reciprocal``;
  float32 no-op Casts between, as the exporters' upcast writes them), the mean over the last
  axis -> ``RMSNorm``; a Cast of the normalised value to another float type
  becomes its ``out_dtype`` (the scale product after that Cast stays: the graph rounds first).
- skip_rms_norm (25): ``RMSNorm(a + b)`` -> ``SkipRMSNorm``, which also outputs the sum when
  the Add has other users (the residual stream).
- gated_mlp (24): ``act(x @ W1) * (x @ W3)`` with ``act`` SiLU (``g * Sigmoid(g)``), GELU (the
  ``Gelu`` the gelu rule made) or Relu, W1 and W3 constant weights of one shape ->
  ``GatedActivation(LinearAct(x, [W1 | W3]))``: the two products packed into one (one pass
  over x, one GEMM of twice the width), the gating one kernel after it.
- gated_product (23): ``GatedActivation(LinearAct(x, [W1 | W3]))`` whose input has a static
  shape -> ``GatedLinear(x, W1, W3)`` (the packed weight split again): a kernel made for its
  rows can then run the activation and the multiplication in its two products' epilogues (no
  pass over the packed product's result). With rows known only at run time the pair stays:
  its products run one GEMM over run-time rows.
"""
from __future__ import annotations

import torch

from ...ir.shape import is_static
from ..facts import const_of
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline, Rule
from .decoder_forms import gated_form, head_split, repeated_heads, rms_form, rotary_form
from .pattern import Pat, Var
from .transformer_forms import interior_reason, keep_shape

_SDPA = "fusegraph::ScaledDotProductAttention"


def _go(why, value=True):
    return value if why is None else why


def _as_const(ctx, v, name):
    return v if v is None or hasattr(v, "producer") else ctx.const(v, name)


# ------------------------------------------------------------------ RMSNorm


def _rms_check(m, ctx):
    form = rms_form(m.root)
    if form is None or isinstance(form, Decline):
        return form
    if not ctx.supports("RMSNorm", FG):
        return Decline("no RMSNorm kernel")
    return _go(interior_reason(form["nodes"], m.root), form)


def _rms_rewrite(m, form, ctx):
    ins = [form["x"]] + ([_as_const(ctx, form["gamma"], "gamma")] if form["gamma"] is not None else [])
    attrs = {"epsilon": form["eps"]}
    if form["out_dtype"] is not None:
        attrs["out_dtype"] = form["out_dtype"]
    return keep_shape(ctx.emit("RMSNorm", ins, attrs, domain=FG), m.root)


def _skip_check(m, ctx):
    norm, add = m.root, m.nodes["add"]
    if norm.attrs.get("out_dtype") is not None:
        return Decline("the norm writes another type than its sum")
    a, b = add.inputs
    if a.dtype != b.dtype or not a.dtype.is_float:
        return Decline("the residual Add is not of one float type")
    if any(v.shape is None or len(v.shape) != len(add.outputs[0].shape or ()) for v in add.inputs):
        return Decline("the residual Add broadcasts")
    if add.outputs[0].is_graph_output:
        return Decline("the residual sum is a graph output")
    return _go(interior_reason([add, norm], norm, allow_outside={id(add)}))


def _skip_rewrite(m, _, ctx):
    norm, add = m.root, m.nodes["add"]
    s = add.outputs[0]
    extra = [u for u, _ in s.uses if u is not norm]
    ctx.root = add   # emit at the Add: the sum's other users may come before the norm
    outs = ctx.emit("SkipRMSNorm", list(add.inputs) + list(norm.inputs[1:]), dict(norm.attrs), domain=FG,
                    outputs=2 if extra else 1)
    y = keep_shape(outs[0] if extra else outs, norm)
    if extra:
        outs[1].shape = s.shape if s.shape is not None else outs[1].shape
        s.replace_all_uses_with(outs[1])
    return y


# ------------------------------------------------------------------ rotary embeddings


def _rotary_check(m, ctx):
    form = rotary_form(m.root)
    if form is None or isinstance(form, Decline):
        return form
    why = interior_reason(form["nodes"], m.root)
    if why is not None:
        return why
    split = head_split(form["x"])
    x = form["x"]
    readers = {id(n) for n, _ in x.uses}
    if split is not None and readers <= {id(n) for n in form["nodes"]} and not x.flags:
        form = {**form, "split": split}
    return form


def _exact_shape(new, old):
    """The rotation's result has x's shape exactly (its kernel refuses a table that would
    enlarge it), so x's dims replace the old result's, which a broadcast against the tables'
    own symbolic length left unknown (onnx's ``unk__N``); old dims fill only unknown ones."""
    o, n = old.outputs[0].shape, new.shape
    if n is not None and o is not None and len(n) == len(o):
        new.shape = tuple(a if a is not None else b for a, b in zip(n, o))
    elif n is None:
        new.shape = o
    return new


def _rotary_rewrite(m, form, ctx):
    split = form.get("split")
    if split is None:
        return _exact_shape(ctx.emit("RotaryEmbedding", [form["x"], form["cos"], form["sin"]], domain=FG), m.root)
    p, heads, reshape, transpose = split
    rot = ctx.emit("RotaryEmbedding", [p, form["cos"], form["sin"]], {"heads": heads}, domain=FG)
    rot.shape = p.shape
    r = ctx.emit("Reshape", [rot, reshape.inputs[1]], dict(reshape.attrs))
    r.shape = reshape.outputs[0].shape
    t = ctx.emit("Transpose", [r], dict(transpose.attrs))
    t.shape = tuple(r.shape[i] for i in (0, 2, 1, 3)) if r.shape is not None else t.shape
    return _exact_shape(t, m.root)


# ------------------------------------------------------------------ grouped-query attention


def _repeat_check(m, ctx):
    sdpa = m.root
    a = sdpa.attrs
    if int(a.get("kv_repeat", 1)) != 1 or a.get("qkv_split") is not None or \
            int(a.get("k_heads", 0)) or int(a.get("v_heads", 0)):
        return None
    k, v = sdpa.input(1), sdpa.input(2)
    got_k, got_v = repeated_heads(k), repeated_heads(v)
    if got_k is None and got_v is None:
        return None
    if got_k is None or got_v is None or got_k[1] != got_v[1]:
        return Decline("k and v are not both repeated the same number of times")
    if int(a.get("k_transposed", 0)):
        return Decline("k comes transposed")
    q = sdpa.inputs[0]
    qs = q.shape
    n = got_k[1]
    if int(a.get("q_heads", 0)):
        heads = int(a["q_heads"])
    else:
        heads = qs[1] if qs is not None and len(qs) == 4 else None
    if not isinstance(heads, int) or heads != got_k[0].shape[1] * n or got_v[0].shape[1] * n != heads:
        return Decline("the query heads are not the repeated k / v heads")
    return _go(interior_reason(got_k[2] + got_v[2] + [sdpa], sdpa), (got_k, got_v))


def _repeat_rewrite(m, found, ctx):
    sdpa = m.root
    (k, n, _), (v, _, _) = found
    ins = list(sdpa.inputs)
    ins[1], ins[2] = k, v
    return keep_shape(ctx.emit("ScaledDotProductAttention", ins, {**sdpa.attrs, "kv_repeat": n}, domain=FG), sdpa)


# ------------------------------------------------------------------ gated MLP


def _gated_check(m, ctx):
    form = gated_form(m.root)
    if form is None or isinstance(form, Decline):
        return form
    return _go(interior_reason(form["nodes"], m.root), form)


def _gated_rewrite(m, form, ctx):
    gate, up = form["gate"], form["up"]
    trans_b = int(gate.attrs.get("trans_b", 0)) if gate.domain == FG else 0
    w1, w3 = const_of(gate.inputs[1]), const_of(up.inputs[1])
    packed = torch.cat([w1, w3], dim=0) if trans_b else torch.cat([w1, w3], dim=1).t()
    ins = [form["x"], ctx.const(packed.contiguous(), "gate_up_weight")]
    if gate.input(2) is not None:
        ins.append(ctx.const(torch.cat([const_of(gate.input(2)), const_of(up.input(2))]), "gate_up_bias"))
    both = ctx.emit("LinearAct", ins, {"trans_b": 1, "activation": "none"}, domain=FG)
    return keep_shape(ctx.emit("GatedActivation", [both], {"activation": form["activation"]}, domain=FG), m.root)


def _gated_product_check(m, ctx):
    product = m.nodes["product"]
    if str(product.attrs.get("activation", "none")) != "none" or int(product.attrs.get("trans_b", 0)) != 1 \
            or product.attrs.get("out_dtype") is not None:
        return Decline("the packed product has an activation, an output type or an untransposed weight")
    w = const_of(m.values["w"])
    if w is None or w.dim() != 2 or w.shape[0] % 2:
        return Decline("the packed weight is not a constant [2N, K]")
    if not is_static(m.values["x"].shape):
        return Decline("rows known at run time only: the packed product runs one GEMM over them")
    return _go(interior_reason(m.matched, m.root))


def _gated_product_rewrite(m, _found, ctx):
    w = const_of(m.values["w"])
    n = w.shape[0] // 2
    ins = [m.values["x"], ctx.const(w[:n].contiguous(), "gate_weight"), ctx.const(w[n:].contiguous(), "up_weight")]
    if m.values.get("b") is not None:
        b = const_of(m.values["b"])
        ins += [ctx.const(b[:n].contiguous(), "gate_bias"), ctx.const(b[n:].contiguous(), "up_bias")]
    return keep_shape(ctx.emit("GatedLinear", ins, {"activation": m.root.attrs["activation"]}, domain=FG), m.root)


# ------------------------------------------------------------------ the rule list

RULES = [
    Rule("attention_repeat_kv", _repeat_check, _repeat_rewrite,
         pattern=Pat(_SDPA, Var("q"), Var("k", lambda v: v is not None and v.producer is not None),
                     Var("v"), ...), priority=47,
         doc="k and v both repeat_kv's Reshape(Expand(Unsqueeze(t, 2))) by the same n; query heads = n * t's"),
    Rule("rotary_embedding", _rotary_check, _rotary_rewrite, pattern=Pat("Add"), priority=36,
         doc="x * cos + cat(-x2, x1) * sin over the last axis (even size), cos / sin broadcast into x"),
    Rule("rms_norm", _rms_check, _rms_rewrite, pattern=Pat(("Mul", "Div", "Cast")), priority=29,
         doc="x * 1/sqrt(mean(x^2) + eps) [* gamma]: mean over the last axis with keepdims, scalar eps >= 0, "
             "gamma a vector along the last axis"),
    Rule("skip_rms_norm", _skip_check, _skip_rewrite,
         pattern=Pat("fusegraph::RMSNorm", Pat("Add", Var("a"), Var("b"), name="add", single_use=False),
                     Var("gamma", optional=True)),
         priority=25, doc="no broadcasting in the Add; the norm's output of the sum's type"),
    Rule("gated_mlp", _gated_check, _gated_rewrite, pattern=Pat("Mul"), priority=24,
         doc="act(x W1) * (x W3), act SiLU / GELU / Relu, W1 and W3 constant of one shape, each product read "
             "only by the gating"),
    Rule("gated_product", _gated_product_check, _gated_product_rewrite,
         pattern=Pat("fusegraph::GatedActivation",
                     Pat("fusegraph::LinearAct", Var("x"), Var("w"), Var("b", optional=True), name="product")),
         priority=23, doc="the packed product read only by the gating, no activation of its own, its input of "
                          "static shape"),
]
