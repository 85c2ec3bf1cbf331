"""Magnitude bounds of every value: where NaN / Inf cannot occur.

Induction: if every float graph input is finite with ``max |x| <= M``, and an op's inputs are
finite with known magnitude bounds, its output is finite with a bound that follows from
them, unless the op can overflow or create NaN itself (a division, a logarithm ...). For a
given ``M`` ``propagate`` walks the graph once and gives every value a ``Fact``: a magnitude
bound and whether it may hold NaN or +-inf. ``guard_plan.py`` uses the facts to decide which
kernels may run their fast (NaN-inexact) form, under which ``M``.

What each op does to a bound is the op's own fact (its value-range transfer,
``ops/value_range.py``, registered with the op); an op with none gives "unknown": no guarded
node downstream admits any ``M`` through it. This module holds the walk and where the
constants' facts come from: each constant's fact is measured once from its bytes
(``ConstantFacts``), from its plain tensor or, for a weight the backend released, from its
packed forms (the backend's ``const_fact``), so a loaded model derives the same limits from its
own weights and trusts nothing the file says about them. A NaN or an infinity anywhere in a
weight makes its fact NaN-carrying, and with it everything computed from it. Integer and
boolean values are finite by nature; a value's type caps its bound (``value_range.cap``).
Nothing here mutates the graph.
"""
from __future__ import annotations

from ....ir import Graph, Node, Value
from ....ops import OpDef, lookup, newest
from ....ops.value_range import (FLOAT32_MAX, INTEGER, ROUNDING, UNKNOWN, Fact, cap, tensor_fact,
                                 transfer_of)

__all__ = ["FLOAT32_MAX", "GRID", "ROUNDING", "ConstantFacts", "Fact", "INTEGER", "UNKNOWN", "op_facts",
           "propagate", "propagate_init", "record_facts", "tensor_fact", "transfer"]

# Input magnitudes tried; the last: any finite one. Denser where feeds are: normalised data
# (a few units), raw pixels (up to 255), token embeddings' scale.
GRID = [1.0, 1e1, 1e2, 1e3, 1e4, 1e8, 1e16, 1e32, FLOAT32_MAX]


class ConstantFacts:
    """Per constant, its fact, measured once (it does not depend on ``M``): from its plain
    tensor, or through ``const_fact(value)`` for a constant whose plain tensor the backend
    released (its shape and dtype only: the backend reads its packed forms)."""

    def __init__(self, const_fact=None):
        self.const_fact = const_fact or (lambda v: UNKNOWN)
        self._consts: dict[int, Fact] = {}

    def const(self, v: Value) -> Fact:
        got = self._consts.get(id(v))
        if got is None:
            t = v.const
            got = tensor_fact(t) if t.device.type != "meta" or not t.is_floating_point() else self.const_fact(v)
            self._consts[id(v)] = got
        return got


def op_facts(node: Node) -> OpDef | None:
    """The registration whose facts hold for ``node``: the one in force at its opset (below
    every opset its op is registered from, the newest: its kernel is refused, the analysis
    stays defined); None for an op the registry does not know."""
    return lookup(node.domain, node.op_type, node.version) or newest(node.domain, node.op_type)


def transfer(node: Node, ins: list[Fact]) -> list[Fact]:
    """The node's output facts from its inputs' by its op's transfer (``UNKNOWN`` for an op
    without one)."""
    t = transfer_of(op_facts(node))
    return [UNKNOWN] * len(node.outputs) if t is None else t(node, ins)


def propagate_init(graph: Graph, m: float, constants: ConstantFacts) -> dict[int, Fact]:
    """The facts before any node: float graph inputs ``Fact(m)``, constants their own."""
    facts: dict[int, Fact] = {}
    for v in graph.inputs:
        facts[id(v)] = INTEGER if v.dtype is not None and not v.dtype.is_float else Fact(m)
    for v in graph.constants.values():
        facts[id(v)] = constants.const(v)
    return facts


def record_facts(node: Node, ins: list[Fact], facts: dict[int, Fact]) -> None:
    """One node's output facts into ``facts``, from its inputs' (``ins``; an absent optional
    input's is ``Fact(0.0)``). A transfer that cannot read the node gives ``UNKNOWN``."""
    try:
        outs = transfer(node, ins) if not node.inputs or node.inputs[0] is not None \
            else [UNKNOWN] * len(node.outputs)
    except (IndexError, TypeError, ValueError, KeyError, AttributeError):
        outs = [UNKNOWN] * len(node.outputs)
    for o, f in zip(node.outputs, outs):
        if o.dtype is not None and not o.dtype.is_float:
            f = INTEGER
        facts[id(o)] = cap(f, o.dtype)


def propagate(graph: Graph, m: float, constants: ConstantFacts | None = None) -> dict[int, Fact]:
    """``{id(value): Fact}`` for float graph inputs finite with ``max |x| <= m``."""
    constants = constants or ConstantFacts()
    facts = propagate_init(graph, m, constants)
    for node in graph.nodes:
        record_facts(node, [Fact(0.0) if v is None else facts.get(id(v), UNKNOWN) for v in node.inputs], facts)
    return facts
