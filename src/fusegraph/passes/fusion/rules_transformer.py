"""Transformer fusion rules (``RULES``), highest priority first; kernels in ``ops/fused_transformer.py``,
recognisers in ``attention_forms.py`` / ``transformer_forms.py``.

- attention (50): ``MatMul(softmax(q' @ k' * s + mask), v)`` where ``q'``/``k'`` may carry
  scalar-constant Muls (the SDPA export scales both), the scores a Mul/Div by a scalar
  constant, the mask an Add of any float value or a ``Where(cond, scores, fill)`` with
  ``fill <= -1e30`` (then ``scores + fill == fill`` in fp32 for every |score| < 1e22: the
  additive form is the same), and the probabilities the exporters' ``Where(IsNaN(p), 0, p)``
  -> ``ScaledDotProductAttention``; a head split (``Transpose(Reshape)``) in front of q / k / v
  used only there is taken in.
- attention_merge_heads (46), attention_split_heads (45), attention_pack_qkv (44): the
  exporters' code around it — the head merge after it (targets proved symbolically), head
  splits left over, and q / k / v packed (one Split, or three projections of one input
  concatenated into one weight: one GEMV instead of three).
- masked_softmax (40) / softmax_nan_to_zero (40): the same scale, mask and NaN guard
  around a Softmax that is not part of an attention -> ``MaskedSoftmax``.
- linear_reshapes (35): ``Reshape(linear(Reshape(x, [-1, K])), x.shape[:-1] + [N])`` ->
  ``linear(x)`` (GPT-2's Conv1D as Gemm), targets read symbolically.
- layer_norm (30-32): ``(x - mean) / sqrt(mean((x - mean)^2) + eps) [* gamma] [+ beta]`` over
  the last axis (``Pow(d, 2)`` or ``d * d``) -> ``LayerNorm``. Statistics differ by rounding.
- gelu (30): the erf and tanh GELU forms (any association of the product), a bias Add in
  front absorbed -> ``Gelu``.
- skip_layer_norm (25): ``LayerNorm(a + b)`` -> ``SkipLayerNorm``, which also outputs the
  sum when the Add has other users (pre-LN residual streams).
- linear_act (20): ``act(Linear | MatMul by a 2-D weight)`` -> ``LinearAct``.
- linear_silu (20): ``p * Sigmoid(p)`` of such a product (SiLU as exporters write it:
  MobileViT's MLPs) -> ``LinearAct`` with ``silu``.
- linear_layer (-50, after every other rule): a MatMul / Linear by a constant 2-D weight of at
  least ``LAYER_MIN_WEIGHT`` elements left over -> ``LinearAct`` without activation, whose
  kernel runs them through oneDNN's inner product.
- elementwise_chain (0): a linear chain of float elementwise ops -> ``ElementwiseChain``.

Every rewrite keeps the replaced value's symbolic shape where it knew more (``keep_shape``),
so later symbolic proofs (head merge, reshapes) see the dims the exporter's shape code reads.
"""
from __future__ import annotations

import torch

from ..facts import const_of, producer
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline, Rule
from .pattern import Const, Pat, Var
from .attention_forms import (LINEARS, absorb_heads, attention_form, merge_heads_reason, pack_qkv_form,
                              reshape_linear_form)
from .transformer_forms import (CHAIN_OPS, chain_form, fg_node, gelu_form, interior_reason, keep_shape,
                                layer_norm_form, scalar, softmax_form, vector_along)



def _go(why, value=True):
    """What a check returns: ``why`` (a ``Decline``) when there is one, else ``value``, which
    the engine hands to the rewrite."""
    return value if why is None else why


# ------------------------------------------------------------------ attention


def _softmaxish(v) -> bool:
    p = v.producer
    return p is not None and (p.op_type in ("Softmax", "Where") and p.domain == "" or fg_node(p, "MaskedSoftmax"))


def _attention_check(m, ctx):
    form = attention_form(m.root)
    if isinstance(form, Decline):
        return form
    if form["k_transposed"] is None:
        return Decline("the probabilities are transposed (BatchMatMul trans_a)")
    if not ctx.supports("ScaledDotProductAttention", FG):
        return Decline("no ScaledDotProductAttention kernel")
    return _go(interior_reason(form["nodes"], m.root), form)


def _attention_rewrite(m, f, ctx):
    mask = f["mask"]
    if f["where"] is not None:
        cond, fill = f["where"]
        dt = f["q"].dtype.to_torch()
        mask = ctx.emit("Where", [cond, ctx.const(torch.zeros((), dtype=dt), "zero"),
                                  ctx.const(torch.tensor(fill, dtype=dt), "fill")])
        if f["mask"] is not None:
            mask = ctx.emit("Add", [mask, f["mask"]])
    ins = [f["q"], f["k"], f["v"]] + ([mask] if mask is not None else [])
    attrs = {"scale": f["scale"], "k_transposed": int(f["k_transposed"]), "nan_to_zero": int(f["nan_to_zero"])}
    attrs.update({f"{t}_heads": f[f"{t}_heads"] for t in "qkv" if f[f"{t}_heads"]})
    return ctx.emit("ScaledDotProductAttention", ins, attrs, domain=FG)


def _heads_check(m, ctx):
    found = absorb_heads(m.root)
    if found is None:
        return Decline("the Transpose/Reshape in front is not a head split")
    return _go(interior_reason(found[2] + [m.root], m.root), found)


def _heads_rewrite(m, found, ctx):
    ins, attrs, _ = found
    return keep_shape(ctx.emit("ScaledDotProductAttention", ins, attrs, domain=FG), m.root)


def _pack_check(m, ctx):
    form = pack_qkv_form(m.root)
    if isinstance(form, Decline):
        return form
    return _go(interior_reason(([form["split"]] if "split" in form else form["mms"]) + [m.root], m.root), form)


def _pack_rewrite(m, form, ctx):
    """One projection (or the Split's input) feeds the SDPA, which splits q / k / v itself."""
    sdpa = m.root
    if "split" in form:
        packed, sizes = form["split"].inputs[0], form["sizes"]
    else:
        mm = form["mms"][0]
        trans_b = mm.domain == FG and int(mm.attrs.get("trans_b", 0))
        ws = [const_of(n.inputs[1]) for n in form["mms"]]
        sizes = [int(w.shape[0] if trans_b else w.shape[1]) for w in ws]
        w = ctx.const(torch.cat(ws, dim=0 if trans_b else 1), "qkv_weight")
        ins = [mm.inputs[0], w]
        if mm.input(2) is not None:
            ins.append(ctx.const(torch.cat([const_of(n.input(2)) for n in form["mms"]]), "qkv_bias"))
        packed = ctx.emit(mm.op_type, ins, dict(mm.attrs), domain=mm.domain)
    ins = [packed, None, None] + list(sdpa.inputs[3:])
    return keep_shape(ctx.emit("ScaledDotProductAttention", ins, {**sdpa.attrs, "qkv_split": sizes}, domain=FG),
                       sdpa)


def _merge_check(m, ctx):
    return _go(merge_heads_reason(m.nodes["sdpa"], m.nodes["t"], m.nodes.get("r3"), m.root))


def _merge_rewrite(m, _, ctx):
    sdpa = m.nodes["sdpa"]
    new = ctx.emit("ScaledDotProductAttention", list(sdpa.inputs), {**sdpa.attrs, "merge_heads": 1}, domain=FG)
    shape = m.root.outputs[0].shape
    if shape is not None and len(shape) == 2:       # [B*L, H*D]: the merged rows, viewed flat
        new = ctx.emit("Reshape", [new, m.root.inputs[1]], {"allowzero": 0})
    return keep_shape(new, m.root)


# ------------------------------------------------------------------ softmax


def _scaled_or_masked(v) -> bool:
    p = v.producer
    return p is not None and p.domain == "" and p.op_type in ("Add", "Mul", "Div") and len(v.uses) == 1


def _softmax_check(m, ctx):
    parts = softmax_form(m.root)
    return parts if isinstance(parts, Decline) else _go(interior_reason(parts[3], m.root), parts)


def _softmax_rewrite(m, parts, ctx):
    x, mask, scale, _ = parts
    return keep_shape(ctx.emit("MaskedSoftmax", [x] + ([mask] if mask is not None else []), {"scale": scale},
                                domain=FG), m.root)


def _nan_check(m, ctx):
    s = m.values["s"].producer
    if scalar(m.values["zero"]) != 0.0:
        return Decline("the Where does not map NaN to 0")
    if s.op_type == "Softmax" and s.domain == "":
        rank = len(s.inputs[0].shape or ())
        axis = int(s.attrs.get("axis", -1 if s.version >= 13 else 1))
        if rank == 0 or axis % rank != rank - 1:
            return Decline("Softmax is not over the last axis")
    elif not fg_node(s, "MaskedSoftmax"):
        return Decline("not a softmax")
    return _go(interior_reason([s, m.nodes["isnan"], m.root], m.root))


def _nan_rewrite(m, _, ctx):
    s = m.values["s"].producer
    attrs = {"scale": 1.0} if s.domain == "" else dict(s.attrs)
    attrs["nan_to_zero"] = 1
    return keep_shape(ctx.emit("MaskedSoftmax", list(s.inputs), attrs, domain=FG), m.root)


# ------------------------------------------------------------------ layer norm


def _ln_check(m, ctx):
    form = layer_norm_form(m)
    return form if isinstance(form, Decline) else _go(interior_reason(m.matched, m.root), form)


def _ln_rewrite(m, form, ctx):
    x, gamma, beta, eps = form
    ins = [x, _as_const(ctx, gamma, "gamma"), _as_const(ctx, beta, "beta")]
    while ins[-1] is None:
        ins.pop()
    return keep_shape(ctx.emit("LayerNorm", ins, {"epsilon": eps}, domain=FG), m.root)


def _as_const(ctx, v, name):
    return v if v is None or hasattr(v, "producer") else ctx.const(v, name)


def _skip_check(m, ctx):
    ln, add = m.root, m.nodes["add"]
    last = (-1, len(ln.inputs[0].shape or ()) - 1)
    if ln.domain == "" and (len(ln.outputs) != 1 or int(ln.attrs.get("axis", -1)) not in last
                            or int(ln.attrs.get("stash_type", 1)) != 1):
        return Decline("LayerNormalization is not over the last axis alone, or has statistics outputs")
    x = ln.inputs[0]
    n = x.shape[-1] if x.shape else None
    if not x.dtype.is_float or not isinstance(n, int):
        return Decline("not floating point, or the normalised size is unknown")
    for v in ln.inputs[1:]:
        if v is not None and (v.shape is None or tuple(v.shape) != (n,)):
            return Decline("scale / bias are not vectors along the last axis")
    if any(v.shape is None or len(v.shape) != len(x.shape) for v in add.inputs):
        return Decline("the residual Add broadcasts")
    if add.outputs[0].is_graph_output:
        return Decline("the residual sum is a graph output")
    return _go(interior_reason([add, ln], ln, allow_outside={id(add)}))


def _skip_rewrite(m, _, ctx):
    ln, add = m.root, m.nodes["add"]
    eps = float(ln.attrs.get("epsilon", 1e-5))
    s = add.outputs[0]
    extra = [u for u, _ in s.uses if u is not ln]
    ctx.root = add   # emit at the Add: the sum's other users may come before the LayerNorm
    outs = ctx.emit("SkipLayerNorm", list(add.inputs) + list(ln.inputs[1:]), {"epsilon": eps}, domain=FG,
                    outputs=2 if extra else 1)
    y = keep_shape(outs[0] if extra else outs, ln)
    if extra:
        outs[1].shape = s.shape if s.shape is not None else outs[1].shape
        s.replace_all_uses_with(outs[1])
    return y


# ------------------------------------------------------------------ GELU and linear + activation


def _gelu_candidate(v) -> bool:
    return gelu_form(v.producer, probe=True) if v.producer is not None else False


def _gelu_check(m, ctx):
    form = gelu_form(m.root)
    if isinstance(form, Decline):
        return form
    return _go(interior_reason(form["nodes"], m.root), form)


def _gelu_rewrite(m, form, ctx):
    x, bias = form["x"], None
    add = producer(x, "Add")
    if (add is not None and not x.flags and not x.is_graph_output
            and all(any(u is n for n in form["nodes"]) for u, _ in x.uses)):
        for side in (0, 1):
            b = vector_along(add.inputs[1 - side], x.shape[-1] if x.shape else None, len(x.shape or ()))
            if b is not None and add.inputs[side].shape is not None and \
                    tuple(add.inputs[side].shape) == tuple(x.shape or ()):
                x, bias = add.inputs[side], b
                break
    ins = [x] + ([_as_const(ctx, bias, "bias")] if bias is not None else [])
    return keep_shape(ctx.emit("Gelu", ins, {"approximate": form["approximate"]}, domain=FG), m.root)


_ACTS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}


def _act_name(node):
    if node.domain == FG and node.op_type == "Gelu":
        return "gelu" if node.attrs.get("approximate", "none") == "none" else "gelu_tanh"
    return _ACTS.get(node.op_type)


def _linear_check(m, ctx):
    mm, act = m.nodes["mm"], m.root
    w = mm.inputs[1]
    if w.shape is None or len(w.shape) != 2 or mm.inputs[0].shape is None or len(mm.inputs[0].shape) < 1:
        return Decline("the weight is not 2-D")
    if not mm.outputs[0].dtype.is_float or act.outputs[0].shape is None or \
            tuple(act.outputs[0].shape) != tuple(mm.outputs[0].shape or ()):
        return Decline("not floating point, or the activation broadcasts")
    bias = act.input(1)
    if bias is not None:
        if mm.input(2) is not None and (const_of(mm.input(2)) is None or const_of(bias) is None):
            return Decline("two biases, not both constant")
        n = mm.outputs[0].shape[-1]
        if bias.shape is None or tuple(bias.shape) != (n,):
            return Decline("the GELU bias is not a vector along N")
    return True


def _linear_rewrite(m, _, ctx):
    mm, act = m.nodes["mm"], m.root
    bias, b2 = mm.input(2), act.input(1)
    if b2 is not None:
        bias = b2 if bias is None else ctx.const(const_of(bias) + const_of(b2), "bias")
    ins = [mm.inputs[0], mm.inputs[1]] + ([bias] if bias is not None else [])
    ins[1], trans_b = _weight_rows(ctx, mm)
    return keep_shape(ctx.emit("LinearAct", ins, {"trans_b": trans_b, "activation": _act_name(act)}, domain=FG),
                       m.root)


def _silu_check(m, ctx):
    mm = m.nodes["mm"]
    w = mm.inputs[1]
    if w.shape is None or len(w.shape) != 2 or mm.inputs[0].shape is None or len(mm.inputs[0].shape) < 1:
        return Decline("the weight is not 2-D")
    if not mm.outputs[0].dtype.is_float or mm.outputs[0].shape is None:
        return Decline("not floating point")
    if mm.domain == FG and (int(mm.attrs.get("trans_a", 0)) or mm.attrs.get("out_dtype") is not None):
        return Decline("a transposed or widened product")
    return True


def _silu_rewrite(m, _, ctx):
    mm = m.nodes["mm"]
    ins = list(mm.inputs)
    ins[1], trans_b = _weight_rows(ctx, mm)
    return keep_shape(ctx.emit("LinearAct", ins, {"trans_b": trans_b, "activation": "silu"}, domain=FG), m.root)


def _weight_rows(ctx, mm):
    """(the weight, trans_b) for a LinearAct replacing ``mm``: a constant ``[K, N]`` weight is
    stored transposed, ``[N, K]`` contiguous, the layout oneDNN's inner product reads directly
    (given ``[K, N]`` it reorders on every call); other weights stay as they are."""
    w = mm.inputs[1]
    trans_b = int(mm.attrs.get("trans_b", 0)) if mm.domain == FG else 0
    t = const_of(w)
    if trans_b or t is None or t.dim() != 2:
        return w, trans_b
    return ctx.const(t.t(), "weight_t"), 1


def _big_matrix(t) -> bool:
    """A weight worth its own kernel choice (smaller ones stay as they are, unrecorded)."""
    return t.dim() == 2 and t.is_floating_point() and t.numel() >= LAYER_MIN_WEIGHT


def _layer_check(m, ctx):
    if m.root.inputs[0].shape is None or len(m.root.inputs[0].shape) < 1 or m.root.outputs[0].shape is None:
        return Decline("the input rank is unknown")
    return True


def _layer_rewrite(m, _, ctx):
    mm = m.root
    ins = list(mm.inputs)
    ins[1], trans_b = _weight_rows(ctx, mm)
    return keep_shape(ctx.emit("LinearAct", ins, {"trans_b": trans_b, "activation": "none"}, domain=FG), mm)


def _reshape_linear_check(m, ctx):
    form = reshape_linear_form(m.root)
    if isinstance(form, Decline):
        return form
    return _go(interior_reason([form[0].inputs[0].producer, form[0], m.root], m.root), form)


def _reshape_linear_rewrite(m, form, ctx):
    mm, x = form
    return keep_shape(ctx.emit(mm.op_type, [x] + list(mm.inputs[1:]), dict(mm.attrs), domain=mm.domain), m.root)


# ------------------------------------------------------------------ elementwise chains


def _chain_link(v) -> bool:
    p = v.producer
    return (p is not None and p.domain == "" and p.op_type in CHAIN_OPS and len(v.uses) == 1
            and not v.is_graph_output and v.dtype.is_float)


def _chain_check(m, ctx):
    form = chain_form(m.root)
    return form if isinstance(form, Decline) else _go(interior_reason(form[2], m.root), form)


def _chain_rewrite(m, form, ctx):
    inputs, steps, _ = form
    return keep_shape(ctx.emit("ElementwiseChain", inputs, {"steps": steps}, domain=FG), m.root)


# ------------------------------------------------------------------ the rule list


def _ln_pattern(square: str, tail: str) -> Pat:
    d = Pat("Sub", Var("x"), Pat("ReduceMean", Var("x"), ..., name="mean"), name="d")
    sq = Pat("Pow", d, Var("two")) if square == "pow" else Pat("Mul", d, d)
    var = Pat("ReduceMean", sq, ..., name="var")
    norm = Pat("Div", d, Pat("Sqrt", Pat("Add", var, Var("eps"))), name="norm")
    if tail == "plain":
        return norm
    scaled = Pat("Mul", norm, Var("gamma"), name="scaled")
    return scaled if tail == "scale" else Pat("Add", scaled, Var("beta"))


_SDPA = "fusegraph::ScaledDotProductAttention"
LAYER_MIN_WEIGHT = 1 << 16   # linear_layer leaves smaller weights to the plain kernels


def _splittable(v) -> bool:
    return producer(v, "Transpose") is not None and len(v.uses) == 1


def _merge_pattern(inner: bool) -> Pat:
    sdpa = Pat(_SDPA, name="sdpa", single_use=False)
    src = Pat("Reshape", sdpa, Var("s3"), name="r3") if inner else sdpa
    return Pat("Reshape", Pat("Transpose", src, attrs={"perm": [0, 2, 1, 3]}, name="t"), Var("s4"))


_SOFTMAX = Pat("Softmax", Var("x", _scaled_or_masked))
_NAN = Pat("Where", Pat("IsNaN", Var("s", lambda v: v.producer is not None), name="isnan"), Var("zero"), Var("s"))
_ATTENTION = Pat(("MatMul", "fusegraph::BatchMatMul"), Var("p", _softmaxish), Var("v"))
_LINEAR = Pat(("Relu", "Sigmoid", "Tanh", "fusegraph::Gelu"),
              Pat(("fusegraph::Linear", "MatMul"), Var("x"), Var("w"), Var("b", optional=True), name="mm"),
              Var("bias", optional=True))
_MM = ("fusegraph::Linear", "MatMul")
_LINEAR_SILU = Pat("Mul", Pat(_MM, Var("x"), Var("w"), Var("b", optional=True), name="mm"),
                   Pat("Sigmoid", Pat(_MM, Var("x"), Var("w"), Var("b", optional=True), name="mm")))
_BINARY_CHAIN = Pat(tuple(op for op in CHAIN_OPS if op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")),
                    Var("p", _chain_link), Var("o"), commutative=True)
_UNARY_CHAIN = Pat(tuple(op for op in CHAIN_OPS if op not in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")),
                   Var("p", _chain_link))

RULES = [
    Rule("attention", _attention_check, _attention_rewrite, pattern=_ATTENTION, priority=50,
         doc="softmax(q k^T * s + mask) v; scale constants scalar; float mask (or huge Where fill)"),
    *[Rule("attention_merge_heads", _merge_check, _merge_rewrite, pattern=_merge_pattern(inner), priority=46,
           doc="Reshape(Transpose(sdpa, [0,2,1,3])) provably [B, L, H*D]; inner Reshape a no-op")
      for inner in (True, False)],
    *[Rule("attention_split_heads", _heads_check, _heads_rewrite,
           pattern=Pat(_SDPA, *[Var(n, _splittable) if n == t else Var(n) for n in "qkv"], ...), priority=45,
           doc="Transpose(Reshape([B,S,H*D] -> [B,S,H,D])) used once")
      for t in "qkv"],
    Rule("attention_pack_qkv", _pack_check, _pack_rewrite,
         pattern=Pat(_SDPA, Var("q", lambda v: v.producer is not None), Var("k"), Var("v"), ...), priority=44,
         doc="q, k, v: one Split of one tensor, or three projections of one input by constant weights, "
             "each read only by the attention"),
    Rule("masked_softmax", _softmax_check, _softmax_rewrite, pattern=_SOFTMAX, priority=40,
         doc="Softmax over the last axis of a scalar-scaled and/or masked input"),
    Rule("softmax_nan_to_zero", _nan_check, _nan_rewrite, pattern=_NAN, priority=40,
         doc="Where(IsNaN(softmax), 0, softmax)"),
    *[Rule("layer_norm", _ln_check, _ln_rewrite, pattern=_ln_pattern(sq, tail), priority=prio,
           doc="mean/variance over the last axis, keepdims, scalar eps, gamma/beta along it")
      for tail, prio in (("affine", 32), ("scale", 31), ("plain", 30)) for sq in ("pow", "mul")],
    Rule("skip_layer_norm", _skip_check, _skip_rewrite,
         pattern=Pat(("LayerNormalization", "fusegraph::LayerNorm"),
                     Pat("Add", Var("a"), Var("b"), name="add", single_use=False),
                     Var("gamma", optional=True), Var("beta", optional=True)),
         priority=25, doc="no broadcasting in the Add; normalised over the last axis"),
    Rule("gelu", _gelu_check, _gelu_rewrite, pattern=Pat("Mul", Var("a", _gelu_candidate), Var("b")), priority=30,
         doc="erf or tanh GELU with its constants within 1e-5; interior values used only inside"),
    Rule("linear_act", _linear_check, _linear_rewrite, pattern=_LINEAR, priority=20,
         doc="2-D weight, activation of the same shape, at most one non-constant bias"),
    Rule("linear_silu", _silu_check, _silu_rewrite, pattern=_LINEAR_SILU, priority=20,
         doc="p * Sigmoid(p), p a product by a 2-D weight read only there: LinearAct with SiLU (oneDNN's swish "
             "post-op, exact on NaN / Inf)"),
    Rule("linear_reshapes", _reshape_linear_check, _reshape_linear_rewrite,
         pattern=Pat("Reshape", Pat(tuple(f"{d}::{t}" if d else t for d, t in LINEARS), ..., name="mm"),
                     Var("target")),
         priority=35,
         doc="Reshape(linear(Reshape(x, [-1, K])), x.shape[:-1] + [N]) with both targets read symbolically"),
    Rule("linear_layer", _layer_check, _layer_rewrite,
         pattern=Pat(("MatMul", "fusegraph::Linear"), Var("x"), Const("w", _big_matrix), Var("b", optional=True)),
         priority=-50, doc="constant 2-D float weight of at least LAYER_MIN_WEIGHT elements: LinearAct, which "
                           "runs them through oneDNN's inner product"),
    Rule("elementwise_chain", _chain_check, _chain_rewrite, pattern=_BINARY_CHAIN, priority=0,
         doc="float chain, every step of the final shape, each link used once"),
    Rule("elementwise_chain", _chain_check, _chain_rewrite, pattern=_UNARY_CHAIN, priority=0,
         doc="float chain, every step of the final shape, each link used once"),
]
