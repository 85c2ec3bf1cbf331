"""The engine for rules rooted at op types: ``RuleSetPass`` applies a family of ``Rule``s
(``rule.py``: ``Rule(name, check, rewrite, ops=(...))``) over a graph once (fixed-point groups
in the pipeline repeat it), plus the rewiring helpers the fusion engine shares.

For each node whose op type a rule names (rules in priority order, then list order), the
rule's ``check(node, ctx)`` returns ``None`` (not applicable: nothing recorded), a
``Decline(reason)`` (counted and, with a ``log``, recorded with its reason), or the value
handed to ``rewrite(node, value, ctx)``. A root output flagged ``external`` / ``no_fuse``
turns an apply into a decline. The engine rewires users, keeps graph outputs distinct, and
removes the root and whatever pure producers it leaves dead. Pattern-rooted rules belong to
the fusion engine (``fusion/engine.py``).
"""
from __future__ import annotations

from typing import Any

from ..errors import PassError
from ..ir import DType, Graph, Node, Value
from ..ir.shape import dims_equal, numel
from ..ops import movement_ops
from .manager import PassOptions, PassResult, is_locked
from .rule import FUSEGRAPH_DOMAIN, Decline, Rule, RuleContext, by_priority, verdict

__all__ = ["FUSEGRAPH_DOMAIN", "Decline", "Rule", "RuleContext", "RuleSetPass", "counts_result",
           "nbytes_of", "record_sources", "rewire", "sweep_dead"]


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
        self.rules = [r for r in by_priority(rules) if r.name not in options.disabled]
        for r in self.rules:
            if r.pattern is not None:
                raise PassError(f"pass {name!r}: rule {r.name!r} has a pattern; pattern rules run in "
                                f"the fusion pass")
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
                match = verdict(rule, rule.check(node, ctx))
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
        news, _ = rewire(ctx, root, new)
        absorbed = []
        if all(not o.uses and not o.is_graph_output for o in root.outputs):
            inputs = [v for v in root.inputs if v is not None]
            graph.remove(root)
            absorbed = sweep_dead(graph, inputs)
        record_sources(news, [root], absorbed, ctx.emitted)


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


def _moves(node: Node) -> bool:
    """Whether ``node`` only moves data (any data-movement class: a view, a copy, a join, a
    pad, a cast): a rewrite's computing node, not such a one, takes its sources."""
    return (node.domain, node.op_type) in movement_ops()


def _stand_in(v: Value, made: dict[int, Node]) -> Node | None:
    """The node that stands for returned value ``v``: its producer, or, when the rewrite made
    it to move data, the computing node the rewrite made that it moves (an attention, not the
    Reshape after it, which a later rule fuses into the next product)."""
    p = q = v.producer
    while q is not None and id(q) in made and _moves(q):
        q = next((x.producer for x in q.inputs if x is not None and id(x.producer) in made), None)
    return q if q is not None and id(q) in made else p


def record_sources(news, matched: list[Node], absorbed: list[tuple[Node, tuple]] = (),
                   emitted: list[Node] = ()) -> None:
    """Remember the names and op types of the model's nodes a rewrite replaces
    (``meta["fused_from"]`` / ``["fused_types"]``, transitively, through the nodes a rule made,
    tagged ``meta["rule"]``): ``Config.op_precision`` names the model's own nodes, which fusion
    renames. The ``matched`` nodes go on the node standing for each returned value
    (``_stand_in``); a node the rewrite left dead (``absorbed``: the node and the inputs it
    had, e.g. a conv whose BatchNorm was folded into a new conv, projections packed into one)
    goes on the computing nodes the rewrite made that read one of its inputs, else with the
    matched ones."""
    made = {id(n): n for n in emitted if n.graph is not None}
    values = news if isinstance(news, (list, tuple)) else [news]
    stand = [p for p in (_stand_in(v, made) for v in values if v is not None) if p is not None]
    computing = [n for n in made.values() if not _moves(n)]
    groups = [(n, stand) for n in matched]
    for n, inputs in absorbed:
        reads = {id(v) for v in inputs if v is not None and not v.is_const}
        groups.append((n, [e for e in computing if reads & {id(v) for v in e.inputs if v is not None}] or stand))
    merged: dict[int, tuple[Node, dict, dict]] = {}   # target -> its names and types, in order
    for n, targets in groups:
        names = ([n.name] if "rule" not in n.meta else []) + list(n.meta.get("fused_from", ()))
        types = ([n.op_type] if "rule" not in n.meta else []) + list(n.meta.get("fused_types", ()))
        for p in targets:
            if p is not n and all(p is not m for m in matched):
                entry = merged.get(id(p))
                if entry is None:
                    entry = merged[id(p)] = (p, dict.fromkeys(p.meta.get("fused_from", ())),
                                             dict.fromkeys(p.meta.get("fused_types", ())))
                entry[1].update(dict.fromkeys(names))
                entry[2].update(dict.fromkeys(types))
    for p, names, types in merged.values():    # written once per target: linear in the names
        p.meta["fused_from"] = list(names)
        p.meta["fused_types"] = list(types)


def _check_compatible(rule: Rule, old: Value, new: Value) -> None:
    bad_dtype = old.dtype and new.dtype and old.dtype != new.dtype
    s, t = old.shape, new.shape
    bad_shape = s is not None and t is not None and (
        len(s) != len(t) or any(dims_equal(a, b) is False for a, b in zip(s, t)))
    if bad_dtype or bad_shape:
        raise PassError(f"rule {rule.name!r} replaced %{old.name}: {old.type_str()} with "
                        f"%{new.name}: {new.type_str()}; a rewrite must keep dtype and shape")


def sweep_dead(graph: Graph, values: list[Value]) -> list[tuple[Node, tuple]]:
    """Remove producers of ``values`` that are now unused, pure and unflagged, recursively;
    returns the removed nodes with the inputs they had (a rewrite absorbed them:
    ``record_sources``)."""
    from ..ops import opdef_for
    removed, work, dead = [], list(values), set()
    while work:
        v = work.pop()
        node = v.producer
        if node is None or node.graph is not graph or id(node) in dead:
            continue
        if any(o.is_graph_output or is_locked(o) or any(id(u) not in dead for u, _ in o.uses)
               for o in node.outputs):
            continue
        try:
            if not opdef_for(node).pure:
                continue
        except Exception:
            continue
        inputs = tuple(node.inputs)
        work.extend(x for x in inputs if x is not None)
        dead.add(id(node))
        removed.append((node, inputs))
    if removed:        # at once: one pass over the node list however long the dead chain is
        graph.remove_nodes(n for n, _ in removed)
    return removed
