"""Read-only recognisers for the decoder fusion rules (``rules_decoder.py``): RMSNorm, rotary
embeddings (rotate-half form), grouped-query attention's repeated k / v heads and gated MLPs,
each in the form the PyTorch exporters write them (``transformers``' Llama, Qwen2, Mistral,
T5 modules through ``torch.onnx.export``).

As in ``transformer_forms.py``: a ``*_form`` function returns what the rewrite needs, a
``Decline(reason)`` when the candidate is that form but cannot be fused, or None when it is
not that form at all (nothing recorded); nothing here mutates the graph.
"""
from __future__ import annotations

from ...ir import DType
from ...ir.shape import dims_equal
from ...ops.shape_values import expand_target, shape_vector
from ..facts import const_of, ints_arg, producer, shapes_equal
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline
from .transformer_forms import fg_node, scalar, vector_along


def _single(v) -> bool:
    return v is not None and len(v.uses) == 1 and not v.is_graph_output and not v.flags


# ------------------------------------------------------------------ RMSNorm

def _mean_square(v, x_of):
    """(x, [nodes]) when ``v = ReduceMean(x * x | Pow(x, 2))`` over the last axis with keepdims,
    ``x_of``: the x the caller's product reads (the same value); else a Decline or None."""
    mean = producer(v, "ReduceMean")
    if mean is None or not _single(v):
        return None
    sq = mean.inputs[0]
    p = producer(sq, "Pow", "Mul")
    if p is None or not _single(sq):
        return None
    if p.op_type == "Pow":
        if p.inputs[0] is not x_of or scalar(p.inputs[1]) != 2.0:
            return None
    elif not (p.inputs[0] is x_of and p.inputs[1] is x_of):
        return None
    rank = len(x_of.shape) if x_of.shape is not None else 0
    if rank == 0:
        return Decline("the input rank is unknown")
    known, axes = ints_arg(mean, 1, "axes", 18)
    if not known or not axes or [a % rank for a in axes] != [rank - 1]:
        return Decline("the mean square is not over the last axis alone")
    if not int(mean.attrs.get("keepdims", 1)):
        return Decline("the mean square drops its axis (keepdims=0)")
    return [mean, p]


def _root_mean_square(v, x):
    """(eps, nodes) when ``v = Sqrt(mean(x^2) + eps)`` (single use), else a Decline or None."""
    s = producer(v, "Sqrt")
    if s is None or not _single(v):
        return None
    add = producer(s.inputs[0], "Add")
    if add is None or not _single(s.inputs[0]):
        return None
    for side in (0, 1):
        got = _mean_square(add.inputs[side], x)
        if got is None:
            continue
        if isinstance(got, Decline):
            return got
        eps = scalar(add.inputs[1 - side])
        if eps is None or eps < 0:
            return Decline("epsilon is not a non-negative scalar constant")
        return eps, got + [add, s]
    return None


def rms_core(node):
    """{x, eps, nodes} when ``node`` is ``x * (1 / sqrt(mean(x^2) + eps))`` (the reciprocal a
    Div of 1 or a Reciprocal) or ``x / sqrt(mean(x^2) + eps)``; else a Decline or None."""
    if node is None or node.domain != "" or len(node.inputs) != 2:
        return None
    if node.op_type == "Div":
        x = node.inputs[0]
        got = _root_mean_square(node.inputs[1], x)
        return _core(x, got, [node])
    if node.op_type != "Mul":
        return None
    for side in (0, 1):
        x, r = node.inputs[side], node.inputs[1 - side]
        inv = r.producer if _single(r) else None
        if inv is None or inv.domain != "":
            continue
        if inv.op_type == "Reciprocal":
            got = _root_mean_square(inv.inputs[0], x)
        elif inv.op_type == "Div" and scalar(inv.inputs[0]) == 1.0:
            got = _root_mean_square(inv.inputs[1], x)
        else:
            continue
        if got is not None:
            return _core(x, got, [inv, node])
    return None


def _core(x, got, tail):
    if got is None or isinstance(got, Decline):
        return got
    if not x.dtype.is_float:
        return Decline("not floating point")
    eps, nodes = got
    return {"x": x, "eps": eps, "nodes": nodes + tail}


def _gamma_of(node, core_out):
    """The scale vector when ``node`` is ``Mul(core_out, gamma)`` (either order) with gamma a
    constant (or value) of shape ``[n]`` along the last axis; else None."""
    if node.domain != "" or node.op_type != "Mul":
        return None
    x = core_out
    n = x.shape[-1] if x.shape else None
    for side in (0, 1):
        if node.inputs[side] is core_out:
            other = node.inputs[1 - side]
            if other is core_out:
                return None
            g = vector_along(other, n, len(x.shape or ()))
            if g is not None and shapes_equal(node.outputs[0].shape, x.shape):
                return g
    return None


def _noop_cast(v):
    """The Cast node producing ``v`` when it converts float32 to float32 (an exporter's upcast
    of a float32 model), else None."""
    c = producer(v, "Cast")
    if c is None or not _single(v) or c.inputs[0].dtype != DType.FLOAT or v.dtype != DType.FLOAT:
        return None
    return c


def rms_form(root):
    """{x, gamma, eps, out_dtype, nodes} of the RMSNorm ending at ``root``: the core itself, the
    core times a scale vector (through a float32 no-op Cast), or a Cast of the core to another
    float type (the scale product after it left alone: the graph rounds before it); else a
    Decline or None."""
    if root.domain != "":
        return None
    if root.op_type == "Cast":
        core = rms_core(root.inputs[0].producer) if _single(root.inputs[0]) else None
        if core is None or isinstance(core, Decline):
            return core
        to = root.outputs[0].dtype
        if not to.is_float or to == DType.FLOAT:
            return None
        return {**core, "gamma": None, "out_dtype": int(to), "nodes": core["nodes"] + [root]}
    if root.op_type == "Mul":
        for side in (0, 1):
            v = root.inputs[side]
            cast = _noop_cast(v)
            src = cast.inputs[0] if cast is not None else v
            if not _single(src):
                continue
            core = rms_core(src.producer)
            if core is None:
                continue
            if isinstance(core, Decline):
                return core
            gamma = _gamma_of(root, v)
            if gamma is None:
                continue
            return {**core, "gamma": gamma, "out_dtype": None,
                    "nodes": core["nodes"] + ([cast] if cast is not None else []) + [root]}
    core = rms_core(root)
    if core is None or isinstance(core, Decline):
        return core
    if _continues(root.outputs[0]):      # the scale product (or a Cast) after it takes the norm in
        return None
    return {**core, "gamma": None, "out_dtype": None}


def _continues(out) -> bool:
    """Whether the norm ``out`` goes on into a scale product, a Cast to another float type, or a
    float32 no-op Cast and then a scale product (``rms_form`` then roots there)."""
    if not _single(out):
        return False
    user = out.uses[0][0]
    if _gamma_of(user, out) is not None:
        return True
    if user.domain != "" or user.op_type != "Cast":
        return False
    cast_out = user.outputs[0]
    if cast_out.dtype != DType.FLOAT:
        return cast_out.dtype.is_float
    return _noop_cast(cast_out) is not None and _gamma_of(cast_out.uses[0][0], cast_out) is not None


# ------------------------------------------------------------------ rotary embeddings

def _slice_of(v, x, start, stop, last, to_end=False):
    """Whether ``v = Slice(x)`` takes ``[start, stop)`` of the last axis (``to_end``: an end at or
    past ``stop``, the axis' size), step 1."""
    s = producer(v, "Slice")
    if s is None or s.inputs[0] is not x or s.version < 10 or not _single(v):
        return False
    args = [const_of(s.input(i)) for i in range(1, 5)]
    if args[0] is None or args[1] is None or any(a is not None and a.numel() != 1 for a in args):
        return False
    b, e = int(args[0].reshape(-1)[0]), int(args[1].reshape(-1)[0])
    axis = int(args[2].reshape(-1)[0]) if args[2] is not None else 0
    step = int(args[3].reshape(-1)[0]) if args[3] is not None else 1
    return step == 1 and axis % (last + 1) == last and b == start and (e >= stop if to_end else e == stop)


def _rotate_half(v, x, d):
    """The nodes of ``Concat(Neg(x[..., d/2:]), x[..., :d/2], axis=-1)``, or None."""
    cat = producer(v, "Concat")
    if cat is None or len(cat.inputs) != 2 or not _single(v):
        return None
    last = len(x.shape) - 1
    if int(cat.attrs.get("axis", 0)) % (last + 1) != last:
        return None
    neg = producer(cat.inputs[0], "Neg")
    if neg is None or not _single(cat.inputs[0]):
        return None
    h = d // 2
    hi = _slice_of(neg.inputs[0], x, h, d, last, to_end=True)
    lo = _slice_of(cat.inputs[1], x, 0, h, last)
    if not (hi and lo):
        return None
    return [neg.inputs[0].producer, neg, cat.inputs[1].producer, cat]


def _fits(table, x) -> bool:
    """``table`` broadcasts into x's shape without enlarging it, as far as the shapes say: no
    dim of it provably other than 1 or x's (a symbolic one, such as the positions' length
    beside the sequence's, is checked by the kernel at run time)."""
    ts, xs = table.shape, x.shape
    if ts is None or len(ts) > len(xs):
        return False
    return not any(dims_equal(t, 1) is False and dims_equal(t, s) is False for t, s in zip(ts[::-1], xs[::-1]))


def _not_larger(out, x) -> bool:
    """``out`` (the graph's result) is not provably larger than x anywhere."""
    return out is not None and len(out) == len(x) and not any(dims_equal(o, d) is False for o, d in zip(out, x))


def rotary_form(root):
    """{x, cos, sin, nodes} of ``x * cos + cat(-x2, x1) * sin`` ending at Add ``root``, or a
    Decline / None."""
    if root.domain != "" or root.op_type != "Add":
        return None
    for m1v, m2v in (root.inputs, root.inputs[::-1]):
        m1, m2 = producer(m1v, "Mul"), producer(m2v, "Mul")
        if m1 is None or m2 is None or not _single(m1v) or not _single(m2v):
            continue
        for rot, sin in (m2.inputs, m2.inputs[::-1]):
            cat = producer(rot, "Concat")
            if cat is None:
                continue
            for x, cos in (m1.inputs, m1.inputs[::-1]):
                if x.shape is None or len(x.shape) < 2:
                    continue
                d = x.shape[-1]
                if not isinstance(d, int) or d % 2:
                    continue
                nodes = _rotate_half(rot, x, d)
                if nodes is None:
                    continue
                if not (x.dtype.is_float and cos.dtype.is_float and sin.dtype.is_float):
                    return Decline("not floating point")
                if not (_fits(cos, x) and _fits(sin, x)) or not _not_larger(root.outputs[0].shape, x.shape):
                    return Decline("cos / sin do not broadcast into the rotated tensor")
                return {"x": x, "cos": cos, "sin": sin, "nodes": [m1] + nodes + [m2, root]}
    return None


def head_split(x):
    """(projection, heads, reshape, transpose) when ``x = Transpose(Reshape(p: [B, S, H*D]) ->
    [B, S, H, D], [0, 2, 1, 3])`` and the Reshape's result is read only by the Transpose; else
    None."""
    t = producer(x, "Transpose")
    if t is None or x.is_graph_output or list(t.attrs.get("perm") or ()) != [0, 2, 1, 3]:
        return None
    r = producer(t.inputs[0], "Reshape")
    if r is None or not _single(t.inputs[0]):
        return None
    p, rs = r.inputs[0], r.outputs[0].shape
    ps = p.shape
    if (ps is None or rs is None or len(ps) != 3 or len(rs) != 4 or not shapes_equal(ps[:2], rs[:2])
            or not all(isinstance(d, int) for d in (ps[2], rs[2], rs[3])) or ps[2] != rs[2] * rs[3]):
        return None
    return p, rs[2], r, t


# ------------------------------------------------------------------ grouped-query attention

def _reshaped(target, src, allowzero: bool):
    """The dims a Reshape of a ``src``-shaped value to ``target`` gives (0 copies the source's
    dim unless ``allowzero``; one -1 is left as None), or None when unreadable."""
    if target is None or sum(e == -1 for e in target) > 1:
        return None
    out = []
    for i, e in enumerate(target):
        if e == 0 and not allowzero:
            if i >= len(src):
                return None
            e = src[i]
        out.append(None if e == -1 else e)
    return out


def repeated_heads(v):
    """(k, repeats, nodes) when ``v = Reshape(Expand(Unsqueeze(k, [2]), [B, Hkv, n, S, D]),
    [B, Hkv*n, S, D])`` (``repeat_kv``: each of k's Hkv heads repeated n times, consecutive),
    each step read only by the next, the shapes proved from the inferred ones or from the
    targets read symbolically (dynamic exports); else None."""
    r = producer(v, "Reshape")
    if r is None or not _single(v):
        return None
    e = producer(r.inputs[0], "Expand")
    if e is None or not _single(r.inputs[0]):
        return None
    u = producer(e.inputs[0], "Unsqueeze")
    if u is None or not _single(e.inputs[0]):
        return None
    k = u.inputs[0]
    ks = k.shape
    if ks is None or len(ks) != 4 or not isinstance(ks[1], int):
        return None
    known, axes = ints_arg(u, 1, "axes", 13)
    if not known or axes is None or [a % 5 for a in axes] != [2]:
        return None
    hkv = ks[1]
    src = (ks[0], hkv, 1, ks[2], ks[3])
    target = expand_target(e.inputs[1])
    if target is None or None in target:
        target = e.outputs[0].shape
    if target is None or len(target) != 5 or not isinstance(target[2], int) or target[2] < 2:
        return None
    n = target[2]
    if not all(dims_equal(t, 1) is True or dims_equal(t, d) is True
               for i, (t, d) in enumerate(zip(target, src)) if i != 2):
        return None
    expanded = (ks[0], hkv, n, ks[2], ks[3])
    got = _reshaped(shape_vector(r.inputs[1]), expanded, bool(int(r.attrs.get("allowzero", 0))))
    if got is None:
        got = list(v.shape) if v.shape is not None else None
    want = (ks[0], hkv * n, ks[2], ks[3])
    if got is None or len(got) != 4 or sum(g is None for g in got) > 1 or \
            not all(g is None or dims_equal(g, w) is True for g, w in zip(got, want)):
        return None
    return k, n, [u, e, r]


# ------------------------------------------------------------------ gated MLPs

LINEAR_OPS = (("", "MatMul"), (FG, "Linear"))


def _product(v):
    """The MatMul / Linear producing ``v`` by a constant 2-D float weight, or None."""
    p = v.producer if v is not None else None
    if p is None or (p.domain, p.op_type) not in LINEAR_OPS:
        return None
    w = const_of(p.inputs[1])
    if w is None or w.dim() != 2 or not w.is_floating_point():
        return None
    if p.domain == FG and (int(p.attrs.get("trans_a", 0)) or p.attrs.get("out_dtype") is not None):
        return None
    if p.input(2) is not None and const_of(p.input(2)) is None:
        return None
    return p


def _activation_of(v):
    """(activation, gate value, nodes) when ``v`` is an activation of one value the gated
    activation computes: ``g * Sigmoid(g)`` (SiLU), fusegraph ``Gelu(g)`` without a bias, Relu."""
    p = v.producer
    if p is None or not _single(v):
        return None
    if fg_node(p, "Gelu") and p.input(1) is None:
        return ("gelu" if p.attrs.get("approximate", "none") == "none" else "gelu_tanh"), p.inputs[0], [p]
    if p.domain != "":
        return None
    if p.op_type == "Relu":
        return "relu", p.inputs[0], [p]
    if p.op_type == "Mul":
        for side in (0, 1):
            g, s = p.inputs[side], p.inputs[1 - side]
            sig = producer(s, "Sigmoid")
            if sig is not None and sig.inputs[0] is g and _single(s):
                return "silu", g, [sig, p]
    return None


def gated_form(root):
    """{x, gate, up, activation, nodes} of ``act(x @ W1) * (x @ W3)`` at Mul ``root`` (W1, W3
    constant weights of one shape), or a Decline / None."""
    if root.domain != "" or root.op_type != "Mul":
        return None
    for a, u in (root.inputs, root.inputs[::-1]):
        act = _activation_of(a)
        if act is None:
            continue
        name, g, nodes = act
        gate, up = _product(g), _product(u)
        if gate is None or up is None or gate is up:
            continue
        uses_g = {id(n) for n, _ in g.uses}
        if uses_g != {id(n) for n in nodes} or g.is_graph_output or not _single(u):
            return Decline("the gate or up projection is read elsewhere")
        if gate.inputs[0] is not up.inputs[0]:
            return Decline("the gate and up projections read different inputs")
        if (gate.domain, gate.op_type, dict(gate.attrs)) != (up.domain, up.op_type, dict(up.attrs)):
            return Decline("the gate and up projections are different products")
        w1, w3 = const_of(gate.inputs[1]), const_of(up.inputs[1])
        if w1.shape != w3.shape or w1.dtype != w3.dtype or (gate.input(2) is None) != (up.input(2) is None):
            return Decline("the gate and up weights differ in shape, type or bias")
        if not shapes_equal(root.outputs[0].shape, g.shape) or not shapes_equal(g.shape, u.shape):
            return Decline("the gating broadcasts")
        return {"x": gate.inputs[0], "gate": gate, "up": up, "activation": name,
                "nodes": [gate, up] + nodes + [root]}
    return None
