"""A declarative pattern matcher over the IR, for fusion rules.

A pattern is a tree of ``Pat`` (an operator node), ``Var`` (any value) and ``Const`` (a
constant value), rooted at the node a rule rewrites::

    Pat("Relu", Pat("Conv", Var("x"), Const("w"), ..., name="conv"))

- ``op`` is an op type or a tuple of them; ``"fusegraph::Linear"`` or ``domain=`` picks a domain.
- Inputs match the node's inputs position by position. A pattern with no inputs does not look
  at the node's inputs; a trailing ``...`` (Ellipsis) lets the node have more inputs than
  listed; otherwise the counts must agree (trailing missing inputs do not count). A
  ``Var(optional=True)`` also matches a missing input (captured as None).
- Commutative ops (``COMMUTATIVE``, or ``commutative=True``) try every order of their inputs.
- The same ``Var`` / ``Const`` name twice must bind the same value; the same ``Pat`` name twice
  the same node (so shared sub-expressions such as ``x - mean`` used twice can be written).
- ``attrs``: attribute name -> required value, or a predicate ``f(value) -> bool`` (a missing
  attribute is passed as None; a required plain value never equals a missing attribute).
- ``single_use`` (default): every consumer of an interior node's outputs is itself a matched
  node and none is a graph output, so fusing the match leaves no dangling use. The root is
  exempt (its outputs are what the rewrite replaces).

Flags: a matched node whose outputs carry ``no_fuse`` (or ``node.meta["no_fuse"]``), and an
interior value flagged ``external``, block the match: ``match`` returns None, and
``explain(pattern, root)`` says why, so the fusion report can list the stopped candidate.

This file only matches; it never mutates the graph (see ``engine.py`` for rewriting).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ...ir import Node, Value

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal",
                         "BitwiseAnd", "BitwiseOr", "BitwiseXor"})
_MAX_PERMUTED = 4   # commutative nodes with more inputs than this are matched in order only


class Var:
    """Matches any value (``predicate(value) -> bool`` when given), captured by name."""

    def __init__(self, name: str, predicate: Callable[[Value], bool] | None = None, *,
                 optional: bool = False):
        self.name, self.predicate, self.optional = name, predicate, optional

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


class Const:
    """Matches a constant value (``predicate(tensor) -> bool`` when given), captured by name."""

    def __init__(self, name: str, predicate: Callable[[Any], bool] | None = None):
        self.name, self.predicate = name, predicate

    def __repr__(self) -> str:
        return f"Const({self.name!r})"


class Pat:
    """Matches a node of op type ``op`` whose inputs match ``inputs``."""

    def __init__(self, op: "str | tuple[str, ...]", *inputs: "Pat | Var | Const", name: str | None = None,
                 commutative: bool | None = None, attrs: dict[str, object] | None = None,
                 single_use: bool = True, domain: str = ""):
        ops = (op,) if isinstance(op, str) else tuple(op)
        self.ops = frozenset(_split(o, domain) for o in ops)
        self.open = bool(inputs) and inputs[-1] is Ellipsis
        self.inputs = tuple(i for i in inputs if i is not Ellipsis)
        if any(i is Ellipsis for i in self.inputs):
            raise ValueError("Pat: '...' may only be the last input")
        self.name = name
        self.commutative = (all(t in COMMUTATIVE for _, t in self.ops) if commutative is None
                            else bool(commutative))
        self.attrs = dict(attrs or {})
        self.single_use = single_use

    def __repr__(self) -> str:
        ops = "|".join(sorted(t if not d else f"{d}::{t}" for d, t in self.ops))
        return f"Pat({ops}{', ' + repr(self.name) if self.name else ''})"


def _split(op: str, domain: str) -> tuple[str, str]:
    dom, _, typ = op.rpartition("::")
    dom = dom or domain
    return ("" if dom == "ai.onnx" else dom, typ)


@dataclass
class Match:
    nodes: dict[str, Node] = field(default_factory=dict)     # named node patterns ("root" unless named)
    values: dict[str, Value | None] = field(default_factory=dict)  # captured Vars / Consts
    matched: list[Node] = field(default_factory=list)        # every covered node, inputs first, root last

    @property
    def root(self) -> Node:
        return self.matched[-1]

    def const(self, name: str):
        """The torch tensor of a captured ``Const``."""
        return self.values[name].const


def match(pattern: Pat, root: Node) -> Match | None:
    """The first match of ``pattern`` rooted at ``root`` that no flag blocks, else None."""
    return next(matches(pattern, root), None)


def matches(pattern: Pat, root: Node) -> Iterator[Match]:
    """Every match of ``pattern`` rooted at ``root`` that no flag blocks, in order (a
    commutative node's input orders included: a rule whose check declines one binding can
    take the next)."""
    for m, reason in _matches(pattern, root):
        if reason is None:
            yield m


def explain(pattern: Pat, root: Node) -> str | None:
    """Why ``pattern`` does not match at ``root`` although its structure does (a flag, a
    graph output inside); None when it matches, or when its structure does not match at all."""
    first = None
    for _, reason in _matches(pattern, root):
        if reason is None:
            return None
        first = first or reason
    return first


# ----------------------------------------------------------------------- matching


def _node_ok(p: Pat, node: Node) -> bool:
    if (node.domain if node.domain != "ai.onnx" else "", node.op_type) not in p.ops:
        return False
    for key, want in p.attrs.items():
        have = node.attrs.get(key)
        if callable(want):
            if not want(have):
                return False
        elif key not in node.attrs or not _equal(have, want):
            return False
    return True


def _equal(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _bind_leaf(leaf, value: Value | None, state: dict) -> dict | None:
    if value is None:
        if not (isinstance(leaf, Var) and leaf.optional):
            return None
    elif isinstance(leaf, Const):
        if not value.is_const or (leaf.predicate is not None and not leaf.predicate(value.const)):
            return None
    elif leaf.predicate is not None and not leaf.predicate(value):
        return None
    values = state["values"]
    if leaf.name in values:
        return state if values[leaf.name] is value else None
    return {**state, "values": {**values, leaf.name: value}}


def _match_inputs(pats, values, state) -> Iterator[dict]:
    if not pats:
        yield state
        return
    head, rest = pats[0], pats[1:]
    for s in _match_operand(head, values[0], state):
        yield from _match_inputs(rest, values[1:], s)


def _match_operand(p, value: Value | None, state: dict) -> Iterator[dict]:
    if not isinstance(p, Pat):
        s = _bind_leaf(p, value, state)
        if s is not None:
            yield s
        return
    if value is None or value.producer is None:
        return
    yield from _match_node(p, value.producer, state, is_root=False)


def _match_node(p: Pat, node: Node, state: dict, is_root: bool) -> Iterator[dict]:
    if not _node_ok(p, node):
        return
    if p.name is not None and p.name in state["nodes"]:
        if state["nodes"][p.name] is node:
            yield state
        return
    ins = list(node.inputs)
    while ins and ins[-1] is None:
        ins.pop()
    if p.inputs:
        if len(ins) < len(p.inputs):
            ins += [None] * (len(p.inputs) - len(ins))
        elif len(ins) > len(p.inputs) and not p.open:
            return
        ins = ins[:len(p.inputs)]
    name = p.name or ("root" if is_root else None)
    orders = [ins]
    if p.commutative and 1 < len(ins) <= _MAX_PERMUTED:
        orders = [list(o) for o in itertools.permutations(ins)]
    for order in orders:
        for s in _match_inputs(p.inputs, order, state) if p.inputs else [state]:
            if any(m is node for m in s["order"]):
                continue  # the same node through two unnamed patterns: not a tree match
            nodes = {**s["nodes"], name: node} if name is not None else s["nodes"]
            yield {**s, "nodes": nodes, "order": s["order"] + [node],
                   "single": s["single"] + ([node] if p.single_use and not is_root else [])}


def _matches(pattern: Pat, root: Node) -> Iterator[tuple[Match, str | None]]:
    start = {"nodes": {}, "values": {}, "order": [], "single": []}
    seen = set()
    for s in _match_node(pattern, root, start, is_root=True):
        key = tuple(id(n) for n in s["order"]) + tuple(id(v) for v in s["values"].values())
        if key in seen:
            continue
        seen.add(key)
        m = Match(dict(s["nodes"]), dict(s["values"]), list(s["order"]))
        reason = _uses_ok(m, s["single"])
        if reason is False:
            continue          # structurally no match (an interior result escapes)
        yield m, reason


def _uses_ok(m: Match, single: list[Node]):
    """False: an interior result has a consumer outside the match (no match at all);
    a string: blocked by a flag; None: fine."""
    inside = {id(n) for n in m.matched}
    for node in single:
        for out in node.outputs:
            if any(id(user) not in inside for user, _ in out.uses):
                return False
    for node in m.matched:
        if node.meta.get("no_fuse") or any("no_fuse" in o.flags for o in node.outputs):
            return f"node {node.name} ({node.op_type}) is flagged no_fuse"
    for node in m.matched[:-1]:
        for out in node.outputs:
            if "external" in out.flags:
                return f"interior value %{out.name} is external"
            if out.is_graph_output and any(node is n for n in single):
                return f"interior value %{out.name} is a graph output"
    return None
