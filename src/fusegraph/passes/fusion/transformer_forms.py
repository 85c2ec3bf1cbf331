"""Read-only recognisers for the transformer fusion rules (``rules_transformer.py``): LayerNorm,
GELU, elementwise chains and shared helpers (attention lives in ``attention_forms.py``).

Each ``*_form`` function takes the root node (or the pattern match) of a candidate and returns
either what the rewrite needs (the inputs, the constants, the covered nodes) or a
``Decline(reason)``: why the candidate is not the fused form. Nothing here mutates the graph; a
rule's check returns the form, which the engine hands to the rule's rewrite (``passes/rule.py``).

Forms that vary in their operand order (GELU's products) are read procedurally from a pattern
root: a product is flattened through single-use Muls, constants
multiplied together, so ``x * 0.5 * a``, ``(x * a) * 0.5`` and ``x * (a * 0.5)`` are one form.
"""
from __future__ import annotations

import math

from ...ops.fused_transformer import BINARY, UNARY
from ..facts import const_of, ints_arg, producer, shapes_equal
from ..rule import FUSEGRAPH_DOMAIN as FG
from ..rule import Decline

CHAIN_OPS = tuple(UNARY) + tuple(BINARY)


def fg_node(node, *ops) -> bool:
    return node is not None and node.domain == FG and node.op_type in ops


def scalar(v) -> float | None:
    """A one-element float constant as a Python float, else None."""
    t = const_of(v)
    if t is None or t.numel() != 1 or not t.is_floating_point():
        return None
    return float(t.reshape(-1)[0])


def _close(value, want, rtol=1e-5) -> bool:
    return value is not None and abs(value - want) <= rtol * abs(want)


def interior_reason(nodes, root, allow_outside=frozenset()) -> Decline | None:
    """Why (a ``Decline``) ``nodes`` (the root last or anywhere) cannot become one node: a flag,
    or an interior result read outside them (``allow_outside``: ids of nodes whose results may
    be). None when they can."""
    inside = {id(n) for n in nodes}
    for n in nodes:
        if n.meta.get("no_fuse") or any("no_fuse" in o.flags for o in n.outputs):
            return Decline(f"blocked: node {n.name} ({n.op_type}) is flagged no_fuse")
        if n is root:
            continue
        for o in n.outputs:
            if "external" in o.flags:
                return Decline(f"blocked: interior value %{o.name} is external")
            if id(n) in allow_outside:
                continue
            if o.is_graph_output:
                return Decline(f"interior value %{o.name} is a graph output")
            if any(id(u) not in inside for u, _ in o.uses):
                return Decline(f"interior value %{o.name} has users outside the pattern")
    return None


def vector_along(v, n, rank):
    """``v`` as something of shape ``[n]``: the value itself, or a constant tensor; else None."""
    if v is None:
        return None
    if v.shape is not None and len(v.shape) == 1 and shapes_equal(v.shape, (n,)):
        return v
    c = const_of(v)
    if c is None or not isinstance(n, int) or c.dim() > rank:
        return None
    if c.numel() == 1:
        return c.reshape(1).expand(n).contiguous()
    if c.numel() == n and c.shape[-1] == n:
        return c.reshape(n).contiguous()
    return None


def keep_shape(new, old):
    """The fused value is the old one: keep the old symbolic dims (downstream shapes were
    inferred from them) except where only the new shape knows the dim."""
    o, n = old.outputs[0].shape, new.shape
    if o is not None:
        new.shape = o if n is None or len(n) != len(o) else tuple(b if a is None else a for a, b in zip(o, n))
    return new


# ------------------------------------------------------------------ softmax


def softmax_form(root):
    """(x, mask, scale, nodes) of ``Softmax(x * scale + mask)`` over the last axis, or a reason."""
    rank = len(root.inputs[0].shape or ())
    axis = int(root.attrs.get("axis", -1 if root.version >= 13 else 1))
    if rank == 0 or axis % rank != rank - 1:
        return Decline("Softmax is not over the last axis")
    x, mask, scale, nodes = root.inputs[0], None, 1.0, [root]
    add = producer(x, "Add")
    if add is not None:   # the scores are the side a product or a scale makes (else the first)
        side = next((i for i in (0, 1) if producer(add.inputs[i], "Mul", "Div", "MatMul") is not None
                     or fg_node(add.inputs[i].producer, "BatchMatMul")), 0)
        x, mask = add.inputs[side], add.inputs[1 - side]
        nodes.append(add)
    p = producer(x, "Mul", "Div")
    if p is not None:
        for side in ((0, 1) if p.op_type == "Mul" else (1,)):
            c = scalar(p.inputs[side])
            if c is not None and c != 0.0:
                scale *= c if p.op_type == "Mul" else 1.0 / c
                x = p.inputs[1 - side]
                nodes.append(p)
                break
    if len(nodes) == 1:
        return Decline("neither scaled nor masked")
    if mask is not None and (not mask.dtype.is_float or mask.dtype != x.dtype):
        return Decline("the mask is not a float of the scores' type")
    return x, mask, scale, nodes


# ------------------------------------------------------------------ layer norm


def layer_norm_form(m):
    """(x, gamma, beta, eps) of a matched decomposed LayerNorm, or a reason."""
    x = m.values["x"]
    rank = len(x.shape) if x.shape is not None else 0
    if rank == 0 or not x.dtype.is_float:
        return Decline("input rank unknown or not floating point")
    for r in (m.nodes["mean"], m.nodes["var"]):
        known, axes = ints_arg(r, 1, "axes", 18)
        if not known or not axes or [a % rank for a in axes] != [rank - 1]:
            return Decline("the means are not over the last axis alone")
        if not int(r.attrs.get("keepdims", 1)):
            return Decline("a mean drops its axis (keepdims=0)")
    if "two" in m.values and scalar(m.values["two"]) != 2.0:
        return Decline("the variance is not of a square")
    eps = scalar(m.values["eps"])
    if eps is None or eps < 0:
        return Decline("epsilon is not a non-negative scalar constant")
    n = x.shape[-1]
    gamma = vector_along(m.values.get("gamma"), n, rank)
    beta = vector_along(m.values.get("beta"), n, rank)
    if (m.values.get("gamma") is not None and gamma is None) or (m.values.get("beta") is not None and beta is None):
        return Decline("gamma / beta do not vary along the last axis only")
    if not shapes_equal(m.root.outputs[0].shape, x.shape):
        return Decline("the affine part broadcasts the result")
    return x, gamma, beta, eps


# ------------------------------------------------------------------ GELU


def _factors(v, nodes, top=False):
    """Leaves of the product tree of ``v`` through single-use Muls (``top``: descend at v)."""
    p = producer(v, "Mul")
    if p is None or (not top and (len(v.uses) != 1 or v.is_graph_output)):
        return [v]
    nodes.append(p)
    return _factors(p.inputs[0], nodes) + _factors(p.inputs[1], nodes)


def _split(vals):
    consts = [scalar(f) for f in vals]
    return math.prod(c for c in consts if c is not None), [f for f, c in zip(vals, consts) if c is None]


def _one_plus(v):
    """(add, inner) when ``v = inner_op(..) + 1`` with inner an Erf or Tanh, else None."""
    add = producer(v, "Add")
    if add is None:
        return None
    for side in (0, 1):
        inner = producer(add.inputs[1 - side], "Erf", "Tanh")
        if inner is not None and _close(scalar(add.inputs[side]), 1.0):
            return add, inner
    return None


def gelu_form(root, probe=False):
    """``probe``: whether ``root``'s product contains ``1 + erf/tanh(..)`` (a cheap filter).
    Else {x, approximate, nodes} of the GELU ending at Mul ``root``, or a reason."""
    if probe:
        if root.op_type == "Add" and root.domain == "":
            return _one_plus(root.outputs[0]) is not None
        return (root.op_type == "Mul" and root.domain == "" and len(root.outputs[0].uses) == 1 and
                any(_one_plus(f) for f in _factors(root.outputs[0], [], top=True)))
    nodes = []
    c, others = _split(_factors(root.outputs[0], nodes, top=True))
    if len(others) != 2:
        return Decline("not x * 0.5 * (1 + erf/tanh(...))")
    for x, a in (others, others[::-1]):
        hit = _one_plus(a)
        if hit is None:
            continue
        add, inner = hit
        if not _close(c, 0.5):
            return Decline(f"the constant factor is {c:g}, not 0.5")
        nodes += [add, inner]
        u = inner.inputs[0]
        if inner.op_type == "Erf":
            div = producer(u, "Div")
            if div is not None and div.inputs[0] is x and _close(scalar(div.inputs[1]), math.sqrt(2.0)):
                return {"x": x, "approximate": "none", "nodes": nodes + [div]}
            k, rest = _split(_factors(u, nodes, top=True))
            if rest == [x] and _close(k, math.sqrt(0.5)):
                return {"x": x, "approximate": "none", "nodes": nodes}
            return Decline("the erf argument is not x / sqrt(2)")
        k, rest = _split(_factors(u, nodes, top=True))
        s = producer(rest[0], "Add") if len(rest) == 1 and _close(k, math.sqrt(2.0 / math.pi)) else None
        if s is None or x not in s.inputs:
            return Decline("the tanh argument is not sqrt(2/pi) * (x + 0.044715 x^3)")
        nodes.append(s)
        k3, cube = _split(_factors(s.inputs[1] if s.inputs[0] is x else s.inputs[0], nodes))
        pw = producer(cube[0], "Pow") if len(cube) == 1 else None
        if pw is not None and pw.inputs[0] is x and scalar(pw.inputs[1]) == 3.0:
            nodes.append(pw)
        elif cube != [x, x, x]:
            return Decline("the tanh argument does not hold x^3")
        if not _close(k3, 0.044715):
            return Decline(f"the cubic coefficient is {k3:g}, not 0.044715")
        return {"x": x, "approximate": "tanh", "nodes": nodes}
    return Decline("no 1 + erf/tanh(...) factor")


# ------------------------------------------------------------------ elementwise chains


def _link_ok(node, shape, dtype) -> bool:
    if node.domain != "" or node.op_type not in CHAIN_OPS:
        return False
    arity = 1 if node.op_type in UNARY else 2
    if len(node.inputs) != arity or any(v is None or v.dtype != dtype for v in node.inputs):
        return False
    return node.outputs[0].dtype == dtype and shapes_equal(node.outputs[0].shape, shape)


def chain_form(root):
    """(inputs, steps, nodes) of the elementwise chain ending at ``root``, or a reason."""
    out = root.outputs[0]
    shape, dtype = out.shape, out.dtype
    if not dtype.is_float or shape is None or not _link_ok(root, shape, dtype):
        return Decline("not a float elementwise op of known shape")
    if len(out.uses) == 1 and not out.is_graph_output and _link_ok(out.uses[0][0], shape, dtype):
        return Decline(f"the chain goes on into {out.uses[0][0].name}")
    chain, node = [root], root
    while True:
        prev = None
        for v in node.inputs:
            p = v.producer
            if (p is not None and len(v.uses) == 1 and not v.is_graph_output and not v.flags
                    and _link_ok(p, shape, dtype)):
                prev = p
                break
        if prev is None:
            break
        chain.insert(0, prev)
        node = prev
    if len(chain) < 2:
        return Decline("a single elementwise op")
    inputs, steps = [], []
    for i, n in enumerate(chain):
        args = []
        for v in n.inputs:
            if i > 0 and v is chain[i - 1].outputs[0]:
                args.append("p")
                continue
            if not any(v is u for u in inputs):
                inputs.append(v)
            args.append(f"i{next(j for j, u in enumerate(inputs) if u is v)}")
        steps.append(" ".join([n.op_type] + args))
    return inputs, steps, chain

