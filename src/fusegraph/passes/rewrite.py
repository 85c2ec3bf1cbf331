"""A small declarative rewrite-rule helper: ``Rule`` (pattern, check, replacement) and
``RuleSetPass``, which applies a family of rules over a graph once (fixed-point groups in
the pipeline repeat it).

A rule names the root op types it looks at. ``check(node, ctx)`` never mutates: it returns
``None`` (pattern does not match), a ``Decline(reason)`` (pattern matches but the rewrite
would be wrong or useless; the reason is recorded), or a match object handed to
``rewrite(node, match, ctx)``. ``rewrite`` creates nodes through ``ctx.emit`` (inserted
before the root, shapes inferred, tagged with the rule's name) and returns the values that
replace the root's outputs (a Value, or a list with ``None`` for outputs left alone). The
helper rewires users, keeps graph outputs distinct, and removes the root and whatever pure
producers it leaves dead. This is not the fusion pattern matcher (``pattern.py``, later).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import PassError
from ..ir import DType, Graph, Node, Value
from ..ir.shape import dims_equal, numel
from ..ops import infer_node, lookup
from .manager import PassOptions, PassResult, is_locked

FUSEGRAPH_DOMAIN = "fusegraph"


class Decline(str):
    """Why a rule whose pattern matched did not rewrite."""


@dataclass(frozen=True)
class Rule:
    name: str
    ops: tuple[str, ...]          # root op types; "fusegraph::Linear" for other domains
    check: Callable[[Node, "RuleContext"], Any]
    rewrite: Callable[[Node, Any, "RuleContext"], Any]
    doc: str = ""                 # the condition under which the rewrite is exact


class RuleContext:
    """What a rule may use: the graph, the options, and node / constant constructors."""

    def __init__(self, graph: Graph, options: PassOptions, rule: Rule, root: Node):
        self.graph, self.options, self.rule, self.root = graph, options, rule, root

    def supports(self, op_type: str, domain: str = "") -> bool:
        version = 1 if domain == FUSEGRAPH_DOMAIN else self.graph.opset.get(domain, 1)
        return lookup(domain, op_type, version) is not None

    def can_materialise(self, nbytes: int | None) -> bool:
        return nbytes is not None and nbytes <= self.options.fold_size_limit

    def emit(self, op_type: str, inputs: list, attrs: dict | None = None, domain: str = "",
             outputs: int = 1) -> Value | list[Value]:
        if domain == FUSEGRAPH_DOMAIN:
            self.graph.opset[FUSEGRAPH_DOMAIN] = 1
        version = 1 if domain == FUSEGRAPH_DOMAIN else self.graph.opset.get(domain, 1)
        node = self.graph.add_node(op_type, inputs, outputs=outputs, attrs=attrs, domain=domain,
                                   version=version, name=f"{self.rule.name}_{op_type.lower()}",
                                   before=self.root)
        node.meta["rule"] = self.rule.name
        inferred = infer_node(node) or []
        for out, (dtype, shape) in zip(node.outputs, inferred):
            if dtype is not None:
                out.dtype = DType(dtype)
            out.shape = shape
        if any(o.dtype == DType.UNDEFINED for o in node.outputs):
            raise PassError(f"rule {self.rule.name!r}: could not infer the dtype of new {op_type} node")
        return node.outputs[0] if outputs == 1 else list(node.outputs)

    def const(self, tensor: torch.Tensor, name: str = "c") -> Value:
        return self.graph.add_constant(f"{self.rule.name}_{name}", tensor.contiguous())


def nbytes_of(shape, dtype: DType) -> int | None:
    n = numel(shape)
    return None if n is None else n * dtype.itemsize


class RuleSetPass:
    """Apply ``rules`` once over the graph, in node order; skip rules named in ``disabled``.

    ``log`` (optional): a list that receives one dict per applied or declined rule match
    (rule, applied, nodes, reason), for the compile report.
    """

    def __init__(self, name: str, rules: list[Rule], options: PassOptions, log: list | None = None):
        self.name, self.options, self.log = name, options, log
        self.rules = [r for r in rules if r.name not in options.disabled]
        self._by_op: dict[tuple[str, str], list[Rule]] = {}
        for r in self.rules:
            for op in r.ops:
                dom, _, typ = op.rpartition("::")
                self._by_op.setdefault((dom, typ), []).append(r)

    def run(self, graph: Graph) -> PassResult:
        applied: dict[str, int] = {}
        declined: dict[str, int] = {}
        for node in list(graph.nodes):
            if node.graph is not graph:
                continue
            for rule in self._by_op.get((node.domain, node.op_type), ()):
                ctx = RuleContext(graph, self.options, rule, node)
                match = rule.check(node, ctx)
                if match is None:
                    continue
                if not isinstance(match, Decline) and any(is_locked(o) for o in node.outputs):
                    match = Decline("an output is flagged external/no_fuse")
                if isinstance(match, Decline):
                    declined[rule.name] = declined.get(rule.name, 0) + 1
                    self._record(rule, node, False, str(match))
                    continue
                names = [node.name]
                self._apply(graph, node, rule.rewrite(node, match, ctx), ctx)
                applied[rule.name] = applied.get(rule.name, 0) + 1
                self._record(rule, None, True, "", names)
                if self.options.on_apply is not None:
                    self.options.on_apply(rule.name, names)
                break
        return counts_result(applied, declined)

    def _record(self, rule: Rule, node: Node | None, applied: bool, reason: str, names=None) -> None:
        if self.log is None:
            return
        names = names or [node.name]
        for rec in self.log:
            if rec["rule"] == rule.name and rec["nodes"] == names and rec["applied"] == applied:
                rec["reason"] = reason
                return
        self.log.append({"rule": rule.name, "applied": applied, "nodes": names, "reason": reason})

    def _apply(self, graph: Graph, root: Node, new, ctx: RuleContext) -> None:
        rewire(ctx, root, new)
        if all(not o.uses and not o.is_graph_output for o in root.outputs):
            inputs = [v for v in root.inputs if v is not None]
            graph.remove(root)
            sweep_dead(graph, inputs)


def counts_result(applied: dict[str, int], declined: dict[str, int]) -> PassResult:
    """The result of a rule-driven pass: changed when a rule applied, with per-rule counts."""
    stats: dict[str, Any] = {}
    if applied:
        stats["applied"] = applied
    if declined:
        stats["declined"] = declined
    return PassResult(bool(applied), stats)


def rewire(ctx, root: Node, new) -> tuple[list, list[tuple[Value, str]]]:
    """Point every use of ``root``'s outputs at its replacement in ``new`` (one value or one per
    output; None keeps the output). Replacements must keep dtype and shape; two graph outputs
    never alias one tensor; flags move to the replacement, which takes the replaced name once
    the root is gone (returned as (value, name) renames)."""
    news = list(new) if isinstance(new, (list, tuple)) else [new]
    renames: list[tuple[Value, str]] = []
    for out, repl in zip(root.outputs, news):
        if repl is None or repl is out:
            continue
        _check_compatible(ctx.rule, out, repl)
        if out.is_graph_output and repl.is_graph_output:
            repl = ctx.emit("Identity", [repl])
        if out.flags:
            repl.flags |= out.flags
            renames.append((repl, out.name))
        out.replace_all_uses_with(repl)
    return news, renames


def _check_compatible(rule: Rule, old: Value, new: Value) -> None:
    bad_dtype = old.dtype and new.dtype and old.dtype != new.dtype
    s, t = old.shape, new.shape
    bad_shape = s is not None and t is not None and (
        len(s) != len(t) or any(dims_equal(a, b) is False for a, b in zip(s, t)))
    if bad_dtype or bad_shape:
        raise PassError(f"rule {rule.name!r} replaced %{old.name}: {old.type_str()} with "
                        f"%{new.name}: {new.type_str()}; a rewrite must keep dtype and shape")


def sweep_dead(graph: Graph, values: list[Value]) -> int:
    """Remove producers of ``values`` that are now unused, pure and unflagged, recursively."""
    from ..ops import opdef_for
    removed, work = 0, list(values)
    while work:
        v = work.pop()
        node = v.producer
        if node is None or node.graph is not graph:
            continue
        if any(o.uses or o.is_graph_output or is_locked(o) for o in node.outputs):
            continue
        try:
            if not opdef_for(node).pure:
                continue
        except Exception:
            continue
        work.extend(x for x in node.inputs if x is not None)
        graph.remove(node)
        removed += 1
    return removed
