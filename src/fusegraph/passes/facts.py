"""Read-only queries that rules share: constants, shapes, single use, op-version arguments,
and two small value-range facts (non-negative, bounded) used to prove rewrite domains.

The range facts are a short table of ops whose outputs are known to be >= 0 or in [-1, 1]
whatever their (non-NaN) input; NaN passes through every one of them, which is what the
rewrites that use them need. (These are per-op facts and could move into the registry.)
"""
from __future__ import annotations

import torch

from ..ir import Node, Value
from ..ir.shape import dims_equal
from .manager import is_locked

NONNEGATIVE_OPS = frozenset({"Relu", "Abs", "Exp", "Sigmoid", "Softmax", "Sqrt", "Softplus"})
UNIT_BOUNDED_OPS = frozenset({"Sigmoid", "Tanh", "Sin", "Cos", "Erf", "Softmax", "Softsign"})


def const_of(v: Value | None) -> torch.Tensor | None:
    return v.const if v is not None and v.is_const else None


def const_all_equal(v: Value | None, scalar) -> bool:
    """``v`` is a non-empty constant whose every element equals ``scalar``."""
    t = const_of(v)
    if t is None or t.numel() == 0:
        return False
    return bool((t == scalar).all())


def shapes_equal(a, b) -> bool:
    """Provably equal shapes (same rank; each dim equal as int or as the same symbol)."""
    return (a is not None and b is not None and len(a) == len(b)
            and all(dims_equal(x, y) is True for x, y in zip(a, b)))


def producer(v: Value | None, *ops: str) -> Node | None:
    """The default-domain node producing ``v`` when its op is one of ``ops``."""
    p = v.producer if v is not None else None
    return p if p is not None and p.domain == "" and p.op_type in ops else None


def only_use(v: Value | None) -> bool:
    """``v`` feeds exactly one input slot, is no graph output and carries no lock flag."""
    return v is not None and len(v.uses) == 1 and not v.is_graph_output and not is_locked(v)


def ints_arg(node: Node, index: int, attr: str, since: int):
    """``(known, ints)`` for an int list that is an attribute before opset ``since`` and an
    input from it on. ``known`` is False for a non-constant input; ints None when absent."""
    if node.version < since:
        val = node.attrs.get(attr)
        return True, None if val is None else [int(a) for a in val]
    v = node.input(index)
    if v is None:
        return True, None
    t = const_of(v)
    return (False, None) if t is None else (True, [int(x) for x in t.reshape(-1).tolist()])


def nonnegative(v: Value) -> bool:
    """``v >= 0`` or NaN everywhere, whatever the graph inputs are."""
    t = const_of(v)
    if t is not None:
        return bool((t >= 0).all()) if t.is_floating_point() or t.dtype != torch.bool else True
    p = v.producer
    if p is None or p.domain != "":
        return False
    if p.op_type in NONNEGATIVE_OPS:
        return True
    return p.op_type == "Mul" and len(p.inputs) == 2 and p.inputs[0] is p.inputs[1]


def unit_bounded(v: Value) -> bool:
    """``|v| <= 1`` or NaN everywhere."""
    t = const_of(v)
    if t is not None:
        return bool((t.abs() <= 1).all())
    p = v.producer
    return p is not None and p.domain == "" and p.op_type in UNIT_BOUNDED_OPS
