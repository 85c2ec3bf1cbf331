"""Fusion rules that trade recomputation or memory for fewer kernels (``RULES``): run by the
"aggressive_fusion" pass only under ``Config(aggressive_fusion=True)`` (``passes/pipeline.py``),
after the default rules, in the same fixed-point group (so those rules see what these leave).

- recompute_into_consumers: a cheap float elementwise node (one ONNX elementwise op, or an
  ``ElementwiseChain`` of at most ``MAX_STEPS`` steps reading at most ``MAX_FULL_READS``
  non-constant full-size tensors) whose result several elementwise consumers read (a residual
  sum read by the next residual, the norm's square and its scale) is recomputed inside each
  of them: each consumer becomes an ``ElementwiseChain`` that begins with the producer's steps,
  and the producer's result is never written. Condition: every consumer is an elementwise op
  or chain of the same shape and type that reads the result in its first step only (a chain
  is linear: a later step cannot refer back). Exact: the same operations on the same values.
- pack_qkv_padded: q, k, v projections of one input that the default ``attention_pack_qkv``
  declines because some carry a bias and others not, or because a scalar constant multiplies
  a projection's result (whisper's and BEiT's exports) -> one projection by the concatenated
  weights (a missing bias is zeros, the scalar folded into its weight and bias) read by the
  attention, which splits q / k / v itself. Equal up to rounding (``s * (x W + b)`` becomes
  ``x (s W) + s b``; a zero bias adds nothing).
- sibling_products: ``MIN_SIBLINGS`` or more ``Linear`` / ``LinearAct`` of one kind
  (activation, orientation) by constant 2-D weights reading the same input (a gated MLP's
  projections, q / k / v ahead of rotary embeddings) -> one product by the concatenated
  weights and a ``Split`` of its result along the last axis: two kernels instead of N, one
  GEMM with a wider N. Two siblings are declined: the Split would cost the kernel the
  packing saves.
- norm_scale_into_products: a normalisation whose result only products by constant 2-D
  weights read (``LayerNorm`` / ``SkipLayerNorm`` with constant gamma / beta, ``RMSNorm`` /
  ``SkipRMSNorm`` with a constant gamma, or an
  ``ElementwiseChain`` ending in a product by a constant vector along the last axis: an RMS
  norm's ``x * r * gamma``) loses its affine step: gamma scales the products' weight rows and
  ``beta W`` joins their bias. The norm still runs (its kernel writes the normalised rows),
  one pass over them fewer. Equal up to rounding (``(x g) W`` is ``x (g W)``).

Each check returns a ``Decline`` with the reason where a candidate is recognised but not
taken; nothing here runs unless the knob is on.
"""
from __future__ import annotations

import torch

from ..facts import const_of, shapes_equal
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline, Rule, RuleContext
from .attention_forms import LINEARS
from .pattern import Pat, Var
from .transformer_forms import CHAIN_OPS, UNARY, keep_shape, scalar

MAX_STEPS = 3          # a producer recomputed in every consumer: at most this many steps ...
MAX_FULL_READS = 2     # ... reading at most this many non-constant tensors of its full size
MAX_CONSUMERS = 4
MIN_SIBLINGS = 3


# ------------------------------------------------------------------ recompute_into_consumers


def _as_chain(node):
    """(inputs, steps) of an elementwise node read as a chain, or None (not elementwise)."""
    if node.domain == FG and node.op_type == "ElementwiseChain":
        return list(node.inputs), [str(s) for s in node.attrs.get("steps", ())]
    if node.domain != "" or node.op_type not in CHAIN_OPS:
        return None
    arity = 1 if node.op_type in UNARY else 2
    if len(node.inputs) != arity or any(v is None for v in node.inputs):
        return None
    return list(node.inputs), [" ".join([node.op_type] + [f"i{k}" for k in range(arity)])]


def _reads_in_first_step_only(inputs, steps, value) -> bool:
    at = {f"i{k}" for k, v in enumerate(inputs) if v is value}
    return any(a in at for a in steps[0].split()[1:]) and \
        not any(a in at for s in steps[1:] for a in s.split()[1:])


def _recompute_check(m, ctx):
    p = m.root
    out = p.outputs[0] if len(p.outputs) == 1 else None
    form = _as_chain(p)
    if form is None or out is None or out.dtype is None or not out.dtype.is_float or out.shape is None:
        return None
    users = list(dict.fromkeys(u for u, _ in out.uses))
    if len(users) < 2:
        return None
    if out.is_graph_output or out.flags or p.meta.get("no_fuse"):
        return Decline("the result is a graph output or flagged")
    inputs, steps = form
    full = sum(1 for v in inputs if not v.is_const and shapes_equal(v.shape, out.shape))
    if len(steps) > MAX_STEPS or full > MAX_FULL_READS:
        return Decline(f"{len(steps)} steps reading {full} full-size tensors: too dear to compute again "
                       f"in each consumer")
    if len(users) > MAX_CONSUMERS:
        return Decline(f"{len(users)} consumers: it would be computed {len(users)} times")
    for u in users:
        got = _as_chain(u)
        if got is None:
            return Decline(f"consumer {u.name} ({u.op_type}) is not elementwise: the result stays needed")
        if u.meta.get("no_fuse") or u.outputs[0].dtype != out.dtype or not shapes_equal(u.outputs[0].shape, out.shape):
            return Decline(f"consumer {u.name} has another shape or type (or is flagged)")
        if not _reads_in_first_step_only(*got, out):
            return Decline(f"consumer {u.name} reads it past its first step")
    return users


def _recompute_rewrite(m, users, ctx):
    p = m.root
    out = p.outputs[0]
    p_inputs, p_steps = _as_chain(p)
    for u in users:
        u_inputs, u_steps = _as_chain(u)
        inputs = list(p_inputs)

        def index(v):
            for k, w in enumerate(inputs):
                if w is v:
                    return f"i{k}"
            inputs.append(v)
            return f"i{len(inputs) - 1}"
        steps = list(p_steps)
        for j, step in enumerate(u_steps):
            op, *args = step.split()
            new = []
            for a in args:
                if a == "p":
                    new.append("p")
                else:
                    v = u_inputs[int(a[1:])]
                    new.append("p" if (j == 0 and v is out) else index(v))
            steps.append(" ".join([op] + new))
        here = RuleContext(ctx.graph, ctx.options, ctx.rule, u)   # the chain goes where the consumer was
        chain = keep_shape(here.emit("ElementwiseChain", inputs, {"steps": steps}, domain=FG), u)
        ctx.emitted.extend(here.emitted)
        made = chain.producer
        for n in (p, u):         # the model's nodes it stands for (``Config.op_precision`` names them)
            made.meta.setdefault("fused_from", []).extend(([n.name] if "rule" not in n.meta else [])
                                                          + list(n.meta.get("fused_from", ())))
            made.meta.setdefault("fused_types", []).extend(([n.op_type] if "rule" not in n.meta else [])
                                                           + list(n.meta.get("fused_types", ())))
        u.outputs[0].replace_all_uses_with(chain)
        ctx.graph.remove(u)
    return [None]


# ------------------------------------------------------------------ pack_qkv_padded


def _projection(v):
    """(product node, scale) when ``v`` is a product by a constant 2-D weight without
    activation, optionally times a scalar constant; else None."""
    scale = 1.0
    node = v.producer
    if node is not None and node.domain == "" and node.op_type == "Mul":
        a, b = node.inputs
        s, inner = (scalar(b), a) if scalar(b) is not None else (scalar(a), b)
        if s is None or inner.producer is None or len(inner.uses) != 1 or inner.is_graph_output or inner.flags:
            return None
        scale, node = s, inner.producer
    if node is None or (node.domain, node.op_type) not in LINEARS or str(node.attrs.get("activation", "none")) != "none" \
            or node.attrs.get("out_dtype") is not None:
        return None
    w, b = const_of(node.input(1)), node.input(2)
    if w is None or w.dim() != 2 or (b is not None and (const_of(b) is None or const_of(b).dim() != 1)):
        return None
    return node, scale


def _pack_check(m, ctx):
    sdpa = m.root
    if sdpa.attrs.get("qkv_split") is not None or not all(int(sdpa.attrs.get(f"{t}_heads", 0)) for t in "qkv"):
        return None
    qkv = list(sdpa.inputs[:3])
    if any(v is None or len(v.uses) != 1 or v.is_graph_output or v.flags for v in qkv):
        return Decline("q, k or v has other users")
    found = [_projection(v) for v in qkv]
    if any(f is None for f in found):
        return Decline("q, k, v are not all products by constant 2-D weights (times a scalar)")
    mms = [n for n, _ in found]
    if len({id(n.inputs[0]) for n in mms}) != 1 or len(set(map(id, mms))) != 3:
        return Decline("q, k, v are not three products of one input")
    if len({const_of(n.inputs[1]).dtype for n in mms}) != 1:
        return Decline("the weights differ in type")
    return found


def _as_kn(node) -> torch.Tensor:
    """A product's constant weight as ``[K, N]``."""
    w = const_of(node.inputs[1])
    return w.t() if node.domain == FG and int(node.attrs.get("trans_b", 0)) else w


def _pack_rewrite(m, found, ctx):
    """One projection by the concatenated weights (a LinearAct, stored ``[N, K]``, when all
    three were; else a Linear) feeds the attention, which splits q / k / v itself."""
    sdpa = m.root
    ws, bs = [], []
    for node, s in found:
        w = _as_kn(node)
        b = const_of(node.input(2)) if node.input(2) is not None else None
        ws.append(w if s == 1.0 else (w.float() * s).to(w.dtype))
        bs.append(torch.zeros(w.shape[1], dtype=w.dtype) if b is None else
                  b if s == 1.0 else (b.float() * s).to(b.dtype))
    sizes = [int(w.shape[1]) for w in ws]
    w = torch.cat(ws, dim=1)
    x = found[0][0].inputs[0]
    if all(n.domain == FG and n.op_type == "LinearAct" for n, _ in found):
        packed = ctx.emit("LinearAct", [x, ctx.const(w.t(), "qkv_weight"), ctx.const(torch.cat(bs), "qkv_bias")],
                          {"trans_b": 1, "activation": "none"}, domain=FG)
    else:
        packed = ctx.emit("Linear", [x, ctx.const(w, "qkv_weight"), ctx.const(torch.cat(bs), "qkv_bias")],
                          {"trans_b": 0}, domain=FG)
    ins = [packed, None, None] + list(sdpa.inputs[3:])
    return keep_shape(ctx.emit("ScaledDotProductAttention", ins, {**sdpa.attrs, "qkv_split": sizes}, domain=FG),
                      sdpa)


# ------------------------------------------------------------------ sibling_products


def _kind(node):
    return (node.domain, node.op_type, int(node.attrs.get("trans_b", 0)), str(node.attrs.get("activation", "none")),
            node.outputs[0].dtype, len(node.outputs))


def _packable(node) -> bool:
    w, b = const_of(node.input(1)), node.input(2)
    return (node.domain == FG and node.op_type in ("Linear", "LinearAct") and w is not None and w.dim() == 2
            and (b is None or (const_of(b) is not None and const_of(b).dim() == 1)) and len(node.outputs) == 1
            and node.outputs[0].shape is not None and isinstance(node.outputs[0].shape[-1], int)
            and node.attrs.get("out_dtype") is None)


def _siblings_check(m, ctx):
    root = m.root
    if not _packable(root):
        return None
    x = root.inputs[0]
    order = {id(n): i for i, n in enumerate(ctx.graph.nodes)}
    sibs = [u for u, k in dict.fromkeys(x.uses) if k == 0 and _packable(u) and _kind(u) == _kind(root)]
    sibs = sorted(dict.fromkeys(sibs), key=lambda n: order[id(n)])
    if len(sibs) < 2 or sibs[0] is not root:
        return None
    if len(sibs) < MIN_SIBLINGS:
        return Decline(f"{len(sibs)} products of one input: one product and a Split cost as many kernels")
    for n in sibs:
        if n.meta.get("no_fuse") or n.outputs[0].flags or n.outputs[0].is_graph_output:
            return Decline(f"{n.name}'s result is a graph output or flagged")
    if len({const_of(n.inputs[1]).dtype for n in sibs}) != 1:
        return Decline("the weights differ in type")
    return sibs


def _siblings_rewrite(m, sibs, ctx):
    root = m.root
    trans_b = int(root.attrs.get("trans_b", 0))
    ws = [const_of(n.inputs[1]) for n in sibs]
    sizes = [int(w.shape[0] if trans_b else w.shape[1]) for w in ws]
    ins = [root.inputs[0], ctx.const(torch.cat(ws, dim=0 if trans_b else 1), "packed_weight")]
    if any(n.input(2) is not None for n in sibs):
        ins.append(ctx.const(torch.cat([const_of(n.input(2)) if n.input(2) is not None else
                                        torch.zeros(k, dtype=ws[0].dtype) for n, k in zip(sibs, sizes)]),
                             "packed_bias"))
    packed = ctx.emit(root.op_type, ins, dict(root.attrs), domain=FG)
    rank = len(packed.shape)
    if ctx.graph.opset.get("", 1) >= 13:
        parts = ctx.emit("Split", [packed, ctx.const(torch.tensor(sizes, dtype=torch.int64), "split")],
                         {"axis": rank - 1}, outputs=len(sibs))
    else:
        parts = ctx.emit("Split", [packed], {"axis": rank - 1, "split": sizes}, outputs=len(sibs))
    for n, part in zip(sibs[1:], parts[1:]):
        keep_shape(part, n)
        n.outputs[0].replace_all_uses_with(part)
        ctx.graph.remove(n)
    return keep_shape(parts[0], root)


# ------------------------------------------------------------------ norm_scale_into_products


def _affine(node):
    """(gamma, beta, what the norm becomes) of a normalisation with a constant affine tail:
    ("ln", first affine input) for LayerNorm / SkipLayerNorm / RMSNorm / SkipRMSNorm (an RMS
    norm has no beta), ("chain", steps, inputs) for a
    chain whose last step multiplies by a constant vector; None otherwise."""
    if node.domain != FG:
        return None
    if node.op_type in ("LayerNorm", "SkipLayerNorm", "RMSNorm", "SkipRMSNorm"):
        first = 2 if node.op_type.startswith("Skip") else 1
        gamma = const_of(node.input(first))
        beta = const_of(node.input(first + 1)) if "Layer" in node.op_type else None
        if (node.input(first) is not None and gamma is None) or (node.input(first + 1) is not None and beta is None) \
                or (gamma is None and beta is None):
            return None
        return gamma, beta, ("ln", first)
    if node.op_type == "ElementwiseChain":
        steps = [str(x) for x in node.attrs.get("steps", ())]
        if len(steps) < 2:
            return None
        op, *args = steps[-1].split()
        other = [a for a in args if a != "p"]
        if op != "Mul" or len(args) != 2 or len(other) != 1:
            return None
        k = int(other[0][1:])
        gamma = const_of(node.inputs[k])
        uses = sum(a == other[0] for s in steps for a in s.split()[1:])
        if gamma is None or gamma.dim() != 1 or uses != 1:
            return None
        keep = [v for j, v in enumerate(node.inputs) if j != k]
        renum = {f"i{j}": f"i{j - (j > k)}" for j in range(len(node.inputs)) if j != k}
        new_steps = [" ".join([s.split()[0]] + [renum.get(a, a) for a in s.split()[1:]]) for s in steps[:-1]]
        return gamma, None, ("chain", new_steps, keep)
    return None


def _norm_check(m, ctx):
    node = m.root
    form = _affine(node)
    if form is None:
        return None
    gamma, beta, _ = form
    y = node.outputs[0]
    k = y.shape[-1] if y.shape else None
    if y.is_graph_output or y.flags or not y.uses or not isinstance(k, int):
        return Decline("the normalised result is a graph output, flagged or of unknown width")
    if any(t is not None and (t.dim() != 1 or t.numel() != k or not t.is_floating_point()) for t in (gamma, beta)):
        return Decline("gamma / beta are not vectors along the normalised axis")
    for u, idx in y.uses:
        if idx != 0 or not _packable(u) or u.inputs[1] is y:
            return Decline(f"{u.name} ({u.op_type}) is not a product by a constant weight: the affine stays")
    return form


def _norm_rewrite(m, form, ctx):
    node = m.root
    gamma, beta, how = form
    y = node.outputs[0]
    if how[0] == "ln":
        first = how[1]
        ins = list(node.inputs[:first])
        new = ctx.emit(node.op_type, ins, dict(node.attrs), domain=FG, outputs=len(node.outputs))
    else:
        new = ctx.emit("ElementwiseChain", how[2], {"steps": how[1]}, domain=FG)
    outs = new if isinstance(new, list) else [new]
    for u in list(dict.fromkeys(u for u, _ in y.uses)):
        trans_b = int(u.attrs.get("trans_b", 0))
        w = const_of(u.inputs[1])
        g = gamma.to(torch.float32) if gamma is not None else None
        wf = w.float()
        scaled = wf if g is None else (wf * g if trans_b else wf * g[:, None])      # [N, K] or [K, N]
        ins = [u.inputs[0], ctx.const(scaled.to(w.dtype), "weight_scaled")]
        bias = const_of(u.input(2))
        if beta is not None:
            shift = (wf @ beta.float()) if trans_b else (beta.float() @ wf)
            bias = shift if bias is None else bias.float() + shift
        if bias is not None:
            ins.append(ctx.const(bias.to(w.dtype), "bias_shifted"))
        here = RuleContext(ctx.graph, ctx.options, ctx.rule, u)
        made = keep_shape(here.emit(u.op_type, ins, dict(u.attrs), domain=FG), u)
        ctx.emitted.extend(here.emitted)
        u.outputs[0].replace_all_uses_with(made)
        ctx.graph.remove(u)
    y_new = keep_shape(outs[0], node)
    return [y_new] + [keep_shape(o, node) if o is not None else None for o in outs[1:]]


RULES = [
    Rule("pack_qkv_padded", _pack_check, _pack_rewrite,
         pattern=Pat("fusegraph::ScaledDotProductAttention", Var("q", lambda v: v.producer is not None), Var("k"),
                     Var("v"), ...), priority=20,
         doc="q, k, v: products of one input by constant weights, biases missing or scalars after them"),
    Rule("sibling_products", _siblings_check, _siblings_rewrite,
         pattern=Pat(("fusegraph::Linear", "fusegraph::LinearAct")), priority=10,
         doc=f"at least {MIN_SIBLINGS} products of one kind of one input by constant 2-D weights"),
    Rule("norm_scale_into_products", _norm_check, _norm_rewrite,
         pattern=Pat(("fusegraph::LayerNorm", "fusegraph::SkipLayerNorm", "fusegraph::RMSNorm",
                      "fusegraph::SkipRMSNorm", "fusegraph::ElementwiseChain")),
         priority=5, doc="every reader of the normalised result is a product by a constant 2-D weight"),
    Rule("recompute_into_consumers", _recompute_check, _recompute_rewrite,
         pattern=Pat(tuple(CHAIN_OPS) + ("fusegraph::ElementwiseChain",)), priority=0,
         doc=f"a cheap elementwise result (<= {MAX_STEPS} steps, <= {MAX_FULL_READS} full-size reads) whose every "
             f"consumer is elementwise of its shape and reads it in its first step"),
]
