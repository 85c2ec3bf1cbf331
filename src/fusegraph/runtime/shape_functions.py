"""A value's run-time shape as a function of other values' shapes, where the ops that made
it say so: ``shape_function(graph, value, leaf_ok)`` returns ``(f, leaves)`` — ``f`` maps
``{id(leaf): tensor}`` to the shape — or None; ``shape_reader`` turns that into the kernel of
a ``Shape`` / ``Size`` node that reads the leaves instead of the value.

Known: leaves (values the caller holds: graph inputs, shape-only values), constants, values
whose inferred shape is all integers, and outputs of ops whose output shape follows from
their input shapes by a fixed rule (``SAME_AS_FIRST``, ``BROADCAST``, ``Gather``,
``LinearAct`` / ``Linear`` by a constant weight). Anything else — a shape read from a
tensor's values (Reshape, Expand, Slice …), an unknown op — is None, and the caller keeps
reading the shape from the tensor itself. Used by ``shape_memo.py`` so that ``Shape`` of an
intermediate (GPT-2 reads the shape of its embeddings) joins the work done once per input
shapes.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..ir import Graph, Value
from ..ir.shape import broadcast_shapes

ShapeFn = Callable[[dict], tuple]     # {id(leaf): tensor} -> shape

SAME_AS_FIRST = {("", op) for op in ("Cast", "CastLike", "Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Neg", "Abs",
                                     "Exp", "Log", "Not", "Identity", "Softmax", "LogSoftmax", "IsNaN", "IsInf",
                                     "Reciprocal", "LayerNormalization")} | \
    {("fusegraph", op) for op in ("Gelu", "LayerNorm", "RMSNorm", "RotaryEmbedding")}
BROADCAST = {("", op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater",
                                 "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min")} | \
    {("fusegraph", op) for op in ("SkipLayerNorm", "ElementwiseChain", "SkipRMSNorm")}


MAX_DEPTH = 200     # producers followed back from one value (a deeper chain is left unknown)
KNOWN = SAME_AS_FIRST | BROADCAST | {("", "Gather"), ("fusegraph", "LinearAct"), ("fusegraph", "Linear")}


def shape_function(graph: Graph, value: Value, leaf_ok: Callable[[Value], bool],
                   _memo: dict | None = None, _depth: int = 0) -> tuple[ShapeFn, list[Value]] | None:
    memo = {} if _memo is None else _memo
    key = id(value)
    if key not in memo:
        memo[key] = None          # a DAG has no cycle; this also bounds the recursion
        memo[key] = _derive(graph, value, leaf_ok, memo, _depth)
    return memo[key]


def _leaves(parts) -> list[Value]:
    out: dict[int, Value] = {}
    for _, leaves in parts:
        for v in leaves:
            out[id(v)] = v
    return list(out.values())


def _derive(graph: Graph, v: Value, leaf_ok, memo: dict, depth: int):
    if v.is_const:
        fixed = tuple(v.const.shape)
        return (lambda env: fixed), []
    if v.shape is not None and all(isinstance(d, int) for d in v.shape):
        fixed = tuple(v.shape)
        return (lambda env: fixed), []
    if leaf_ok(v):
        return (lambda env, k=id(v): tuple(env[k].shape)), [v]
    node = v.producer
    op = None if node is None else (node.domain, node.op_type)
    if op not in KNOWN or depth >= MAX_DEPTH:
        return None
    ins = [None if u is None else shape_function(graph, u, leaf_ok, memo, depth + 1) for u in node.inputs]
    if op in SAME_AS_FIRST and ins and ins[0] is not None and v is node.outputs[0]:
        return ins[0]
    if op in BROADCAST and all(f is not None for f, u in zip(ins, node.inputs) if u is not None):
        parts = [f for f in ins if f is not None]
        fns = [f for f, _ in parts]
        return (lambda env: tuple(broadcast_shapes(*(f(env) for f in fns)))), _leaves(parts)
    if op == ("", "Gather") and len(ins) == 2 and None not in ins and v is node.outputs[0]:
        (data, _), (idx, _) = ins
        axis = int(node.attrs.get("axis", 0))

        def gather(env):
            d = data(env)
            a = axis % len(d)
            return d[:a] + idx(env) + d[a + 1:]
        return gather, _leaves(ins)
    if op in (("fusegraph", "LinearAct"), ("fusegraph", "Linear")) and ins and ins[0] is not None \
            and node.inputs[1] is not None and node.inputs[1].is_const and node.inputs[1].const.dim() == 2:
        w = node.inputs[1].const
        n = int(w.shape[0] if int(node.attrs.get("trans_b", 0)) else w.shape[1])
        x, leaves = ins[0]
        return (lambda env: x(env)[:-1] + (n,)), leaves
    return None


def shape_reader(node, fn: ShapeFn, leaves: list[Value]) -> Callable:
    """A kernel computing the ``Shape`` / ``Size`` ``node`` from the tensors of ``leaves``
    (``fn`` gives its input's shape)."""
    keys = [id(v) for v in leaves]
    if node.op_type == "Size":
        def size(*xs):
            n = 1
            for d in fn(dict(zip(keys, xs))):
                n *= d
            return torch.tensor(n, dtype=torch.int64)
        return size
    start, end = node.attrs.get("start"), node.attrs.get("end")

    def shape(*xs):
        s = fn(dict(zip(keys, xs)))
        return torch.tensor(s[slice(start, end)], dtype=torch.int64)
    return shape
