"""Read-only recognisers for the attention rules (``rules_transformer.py``): the parts of
``MatMul(softmax(q' @ k' * s + mask), v)``, the head split in front of q / k / v, and the head
merge after it, reading Reshape targets symbolically (``ops/shape_values.shape_vector``) so
dynamic exports (targets built from Shape / Gather / Concat) are proved, not assumed.

Like ``transformer_forms.py``: each function returns what the rewrite needs or a
``Decline(reason)`` (why the candidate is not that form), and nothing here mutates the graph.
"""
from __future__ import annotations

import math

from ...ir.shape import dims_equal
from ...ops import infer_node
from ...ops.shape_values import shape_vector
from ..facts import const_of, producer, shapes_equal
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline
from .transformer_forms import fg_node, scalar

LINEARS = (("", "MatMul"), (FG, "Linear"), (FG, "LinearAct"))
BIG_FILL = -1e30   # a Where fill at or below this is absorbed by any |score| < 1e22 in fp32


def _matmul_of(v):
    p = v.producer if v is not None else None
    if p is not None and ((p.domain == "" and p.op_type == "MatMul") or fg_node(p, "BatchMatMul")):
        return p
    return None


def _peel_scale(v, nodes):
    """(value, factor) with one scalar-constant Mul / Div peeled off ``v`` (factor 1 if none)."""
    p = producer(v, "Mul", "Div")
    if p is None:
        return v, 1.0
    sides = (0, 1) if p.op_type == "Mul" else (1,)
    for side in sides:
        c = scalar(p.inputs[side])
        if c is not None and c != 0.0 and math.isfinite(c):
            nodes.append(p)
            return p.inputs[1 - side], (c if p.op_type == "Mul" else 1.0 / c)
    return v, 1.0


def _last_axis_softmax(sm) -> bool:
    rank = len(sm.inputs[0].shape or ())
    axis = int(sm.attrs.get("axis", -1 if sm.version >= 13 else 1))
    return rank > 0 and axis % rank == rank - 1


def attention_form(root):
    """The parts of ``MatMul(softmax(...), v)`` (see rules_transformer.py), or a reason."""
    nodes = [root]
    if fg_node(root, "BatchMatMul") and (int(root.attrs.get("trans_a", 0)) or int(root.attrs.get("trans_b", 0))):
        return Decline("the probabilities or V are transposed (BatchMatMul flags)")
    p, v = root.inputs
    form = {"v": v, "mask": None, "where": None, "scale": 1.0, "nan_to_zero": False, "nodes": nodes}
    w = p.producer
    if w.domain == "" and w.op_type == "Where":
        isn = producer(w.inputs[0], "IsNaN")
        if isn is None or isn.inputs[0] is not w.inputs[2] or scalar(w.inputs[1]) != 0.0:
            return Decline("the probabilities pass a Where that is not Where(IsNaN(p), 0, p)")
        nodes += [w, isn]
        p, form["nan_to_zero"] = w.inputs[2], True
    sm = p.producer
    if fg_node(sm, "MaskedSoftmax"):
        nodes.append(sm)
        x, form["mask"], form["scale"] = sm.inputs[0], sm.input(1), float(sm.attrs.get("scale", 1.0))
        form["nan_to_zero"] |= bool(int(sm.attrs.get("nan_to_zero", 0)))
    elif sm is not None and sm.domain == "" and sm.op_type == "Softmax":
        if not _last_axis_softmax(sm):
            return Decline("Softmax is not over the last axis")
        nodes.append(sm)
        x = sm.inputs[0]
        why = _peel_mask_and_scale(x, form, nodes)
        if isinstance(why, Decline):
            return why
        x = why
    else:
        return Decline("the probabilities do not come from a Softmax")
    mm = _matmul_of(x)
    if mm is None:
        return Decline("the scores are not a MatMul")
    nodes.append(mm)
    if mm.domain == FG and int(mm.attrs.get("trans_a", 0)):
        form["k_transposed"] = None
    else:
        form["k_transposed"] = not (mm.domain == FG and int(mm.attrs.get("trans_b", 0)))
    q, fq = _peel_scale(mm.inputs[0], nodes)
    k, fk = _peel_scale(mm.inputs[1], nodes)
    form.update(q=q, k=k, scale=form["scale"] * fq * fk)
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1] if form["k_transposed"] else [0, 2, 1, 3]),
                    ("v", [0, 2, 1, 3])):
        x, heads = _split_heads(form[t], perm, nodes)
        form[t], form[f"{t}_heads"] = x, heads
    if form["k_transposed"] and not form["k_heads"]:   # k^T made by a Transpose of k: read k itself
        kt = form["k"]
        t = producer(kt, "Transpose")
        if t is not None and len(kt.uses) == 1 and not kt.is_graph_output and kt.shape is not None \
                and list(t.attrs.get("perm") or ()) == list(range(len(kt.shape) - 2)) + [len(kt.shape) - 1,
                                                                                       len(kt.shape) - 2]:
            nodes.append(t)
            form["k"], form["k_transposed"] = t.inputs[0], False
    if not (q.dtype.is_float and q.dtype == k.dtype == v.dtype):
        return Decline("q, k, v are not of one float type")
    if any(t.shape is None or len(t.shape) < 2 for t in (q, k, v)):
        return Decline("q, k or v has unknown rank or rank < 2")
    if form["mask"] is not None and (form["mask"].dtype != q.dtype or form["mask"].shape is None
                                     or len(form["mask"].shape) > len(q.shape)):
        return Decline("the mask is not a float of the scores' type and rank")
    scores = mm.outputs[0].shape
    if form["mask"] is not None and scores is not None and any(
            isinstance(m, int) and m > 1 and isinstance(d, int) and d != m
            for m, d in zip(form["mask"].shape[::-1], scores[::-1])):
        return Decline("the mask broadcasts the scores to a larger shape")
    return form


def _split_heads(v, perm, nodes):
    """(x, H) when ``v = Transpose(Reshape(x: [B, S, H*D]) -> [B, S, H, D], perm)``, each used
    once; else (v, 0)."""
    t = producer(v, "Transpose")
    if t is None or len(v.uses) != 1 or v.is_graph_output or list(t.attrs.get("perm") or ()) != perm:
        return v, 0
    r = producer(t.inputs[0], "Reshape")
    if r is None or len(t.inputs[0].uses) != 1 or t.inputs[0].is_graph_output:
        return v, 0
    x, rs = r.inputs[0], r.outputs[0].shape
    xs = x.shape
    if (xs is None or rs is None or len(xs) != 3 or len(rs) != 4 or not shapes_equal(xs[:2], rs[:2])
            or not all(isinstance(d, int) for d in (xs[2], rs[2], rs[3])) or xs[2] != rs[2] * rs[3]):
        return v, 0
    nodes += [t, r]
    return x, rs[2]


def absorb_heads(node):
    """(inputs, attrs) of SDPA ``node`` with the head splits in front of q / k / v taken in,
    or None when there is none to take."""
    ins, attrs, nodes = list(node.inputs), dict(node.attrs), []
    k_perm = [0, 2, 3, 1] if int(attrs.get("k_transposed", 0)) else [0, 2, 1, 3]
    for i, (t, perm) in enumerate((("q", [0, 2, 1, 3]), ("k", k_perm), ("v", [0, 2, 1, 3]))):
        if not int(attrs.get(f"{t}_heads", 0)):
            ins[i], heads = _split_heads(ins[i], perm, nodes)
            if heads:
                attrs[f"{t}_heads"] = heads
    return (ins, attrs, nodes) if nodes else None


def merge_heads_reason(sdpa, transpose, inner, root):
    """Why (a ``Decline``) ``Reshape(Transpose(Reshape?(sdpa_out), [0,2,1,3]), s)`` is not the plain
    head merge ``[B, H, L, D] -> [B, L, H*D]``, or that merge with its rows flattened,
    ``[B*L, H*D]`` (None: it is). Shapes are compared symbolically."""
    o = sdpa.outputs[0].shape
    if o is None or len(o) != 4 or not isinstance(o[1], int) or not isinstance(o[3], int):
        return Decline("the attention output's head count / size is unknown")
    inferred = (infer_node(sdpa) or [(None, None)])[0][1]
    alias = [{d} | ({inferred[i]} if inferred is not None and len(inferred) == 4 else set()) for i, d in enumerate(o)]
    if inner is not None and not _same_vector(shape_vector(inner.inputs[1]), alias,
                                              int(inner.attrs.get("allowzero", 0))):
        return Decline("the Reshape after the attention is not provably a no-op")
    want = [alias[0], alias[2], {o[1] * o[3]}]
    target = shape_vector(root.inputs[1])
    rows = {o[0] * o[2]} if isinstance(o[0], int) and isinstance(o[2], int) else set()
    if 1 in alias[0]:              # one batch item: B*L is L
        rows |= alias[2]
    merged = _same_vector(target, want, int(root.attrs.get("allowzero", 0)))
    flattened = _same_vector(target, [rows, {o[1] * o[3]}], 1)    # [B*L | -1, H*D]; a 0 would copy B
    if not (merged or flattened):
        return Decline("the final Reshape does not provably merge the heads")
    keep = {id(n) for n in (inner, root) if n is not None}
    for user, _ in sdpa.outputs[0].uses:
        if user is not (inner or transpose) and not _feeds_only(user, keep):
            return Decline(f"the attention output is also read by {user.name}")
    return None


def _same_vector(entries, dims, allowzero) -> bool:
    """``entries`` (a Reshape target) gives ``dims`` (per dim, a set of equal names) exactly:
    each entry equal to one of them, 0 (copy) or a single -1."""
    if entries is None or len(entries) != len(dims) or sum(e == -1 for e in entries) > 1:
        return False
    return all(e == -1 or (e == 0 and not allowzero) or
               (e is not None and any(d is not None and dims_equal(e, d) is True for d in ds))
               for e, ds in zip(entries, dims))


def _feeds_only(node, targets, depth=6) -> bool:
    """``node`` is shape arithmetic whose results reach only ``targets`` (so it dies with them)."""
    if id(node) in targets:
        return True
    if depth == 0 or node.domain != "" or node.op_type not in ("Shape", "Gather", "Unsqueeze", "Concat", "Squeeze"):
        return False
    return all(not o.is_graph_output and all(_feeds_only(u, targets, depth - 1) for u, _ in o.uses)
               for o in node.outputs)


def _peel_mask_and_scale(x, form, nodes):
    """Walk from the softmax input down to the scores MatMul: at most one additive mask, one
    Where mask, then scalar scales; returns the scores value or a reason."""
    scaled = False
    for _ in range(6):
        if _matmul_of(x) is not None:
            return x
        p = x.producer
        if p is None or p.domain != "":
            break
        if p.op_type == "Add" and form["mask"] is None:
            side = next((s for s in (0, 1) if _leads_to_matmul(p.inputs[s])), None)
            if side is None:
                break
            if scaled:
                return Decline("the scale applies after the mask")
            nodes.append(p)
            x, form["mask"] = p.inputs[side], p.inputs[1 - side]
        elif p.op_type == "Where" and form["where"] is None and _leads_to_matmul(p.inputs[1]):
            fill = scalar(p.inputs[2])
            if fill is None or not fill <= BIG_FILL:
                return Decline(f"the Where mask fills {fill}: not large enough for an additive mask to be exact")
            if scaled:
                return Decline("the scale applies after the mask")
            nodes.append(p)
            x, form["where"] = p.inputs[1], (p.inputs[0], fill)
        elif p.op_type in ("Mul", "Div"):
            y, f = _peel_scale(x, nodes)
            if y is x:
                break
            x, form["scale"], scaled = y, form["scale"] * f, True
        else:
            break
    return Decline("the scores are not MatMul [* scale] [+ mask]")


def _leads_to_matmul(v, depth=3) -> bool:
    for _ in range(depth):
        if _matmul_of(v) is not None:
            return True
        p = producer(v, "Mul", "Div", "Where", "Add")
        if p is None:
            return False
        v = p.inputs[1] if p.op_type == "Where" else p.inputs[0]
    return _matmul_of(v) is not None


def pack_qkv_form(sdpa):
    """How q, k, v of SDPA ``sdpa`` (each split into heads by it) come from one tensor, or a
    reason: {"split": Split node} (a Split of one tensor in three along its last axis), or
    {"mms": [MatMul | Linear] * 3} (three products of one input by constant 2-D weights)."""
    if sdpa.attrs.get("qkv_split") is not None:
        return Decline("q, k and v are already packed")
    qkv = list(sdpa.inputs[:3])
    if not all(int(sdpa.attrs.get(f"{t}_heads", 0)) for t in "qkv"):
        return Decline("q, k, v are not all split into heads here")
    if any(v is None or len(v.uses) != 1 or v.is_graph_output or v.flags for v in qkv):
        return Decline("q, k or v has other users")
    sp = producer(qkv[0], "Split")
    if sp is not None:
        rank = len(sp.inputs[0].shape or ())
        if (len(sp.outputs) != 3 or [o for o in sp.outputs] != qkv or rank == 0
                or int(sp.attrs.get("axis", 0)) % rank != rank - 1):
            return Decline("the Split is not of one tensor into exactly q, k, v along its last axis")
        sizes = [o.shape[-1] if o.shape else None for o in qkv]
        if not all(isinstance(n, int) for n in sizes):
            return Decline("split sizes unknown")
        return {"split": sp, "sizes": sizes}
    mms = [v.producer for v in qkv]
    kinds = {(m.domain, m.op_type, int(m.attrs.get("trans_b", 0)), m.attrs.get("activation", "none"))
             if m is not None else None for m in mms}
    kind = next(iter(kinds))
    if (len(kinds) != 1 or kind is None or (kind[0], kind[1]) not in LINEARS or kind[3] != "none"
            or (kind[0] == "" and kind[2])):
        return Decline("q, k, v are not three MatMul / Linear of one kind")
    if len({id(m.inputs[0]) for m in mms}) != 1:
        return Decline("q, k, v are not projections of one input")
    if any(const_of(m.inputs[1]) is None or const_of(m.inputs[1]).dim() != 2 for m in mms):
        return Decline("the projection weights are not constant 2-D")
    biases = [m.input(2) for m in mms]
    if any(b is not None for b in biases) and not all(const_of(b) is not None and const_of(b).dim() == 1
                                                       for b in biases):
        return Decline("the projection biases are not all constant vectors")
    return {"mms": mms}



def reshape_linear_form(root):
    """(linear node, x) when ``Reshape(linear(Reshape(x, [-1, K])), x.shape[:-1] + [N])`` is
    provably ``linear(x)`` (a product by a 2-D weight maps leading dims independently), or a reason."""
    mm = root.inputs[0].producer
    if mm is None or (mm.domain, mm.op_type) not in LINEARS or len(root.inputs[0].uses) != 1:
        return Decline("not a linear layer")
    inner = producer(mm.inputs[0], "Reshape")
    w, x = mm.inputs[1], inner.inputs[0] if inner is not None else None
    if inner is None or len(mm.inputs[0].uses) != 1 or w.shape is None or len(w.shape) != 2:
        return Decline("the linear input is not a Reshape, or the weight is not 2-D")
    xs, out = x.shape, mm.outputs[0].shape
    if xs is None or len(xs) < 3 or out is None or len(out) != 2:
        return Decline("the input rank is unknown or below 3")
    flat = shape_vector(inner.inputs[1])
    if flat is None or len(flat) != 2 or flat[0] != -1 or not _same_vector(flat[1:], [{xs[-1]}], 1):
        return Decline("the inner Reshape does not provably flatten the leading dims")
    if not _same_vector(shape_vector(root.inputs[1]), [{d} for d in xs[:-1]] + [{out[-1]}], 1):
        return Decline("the outer Reshape does not provably restore the leading dims")
    return mm, x
