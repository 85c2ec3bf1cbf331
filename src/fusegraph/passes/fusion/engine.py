"""The fusion engine: ``FusionPass`` (pass "fusion"), which applies the pattern rules
(``rule.Rule`` with ``pattern=``) of ``rules_cnn.RULES``, ``rules_transformer.RULES``,
``rules_decoder.RULES`` and ``rules_movement.RULES``.

Rules run highest ``priority`` first, each over the whole graph before the next (so a larger
pattern such as Conv+Add+Relu gets its chance before Conv+Add), and the whole list repeats
until nothing changes. For each candidate root:

- the pattern does not match -> nothing recorded;
- the structure matches but a ``no_fuse`` node or an ``external`` interior value blocks it
  -> a declined record with the reason from ``pattern.explain``;
- ``check(match, ctx)`` returns ``None`` -> not applicable, nothing recorded;
- ``check`` returns ``Decline(reason)`` -> a declined record with that reason;
- anything else -> ``rewrite(match, value, ctx)`` (``value``: what check returned) builds the
  fused node(s) through ``ctx.emit`` (tagged ``node.meta["rule"]``) and returns the values that
  replace the root's outputs; the engine rewires users and removes the matched nodes left dead.

This is the convention of ``rule.py``, the same as the op-rooted rules of ``rewrite.py``.
A root output flagged ``external`` keeps its name and flags on the value that replaces it,
so ``Config.external_tensors`` still finds it. Records go into the shared log that
``passes.optimize`` turns into ``report.fusions``. This file knows no rule.
"""
from __future__ import annotations

import importlib

from ...errors import PassError
from ...ir import Graph, Node, Value
from ..manager import PassOptions, PassResult
from ..rewrite import counts_result, record_sources, rewire, sweep_dead
from ..rule import Decline, Rule, RuleContext, by_priority, verdict
from .pattern import Match, explain, matches

RULE_MODULES = ("rules_cnn", "rules_conv_pad", "rules_norm_cnn", "rules_layer_scale", "rules_channels_last",
                "rules_transformer", "rules_decoder", "rules_movement")


class FusionContext(RuleContext):
    """What a check / rewrite may use: graph, options, the match, ``emit`` and ``const``."""

    def __init__(self, graph: Graph, options: PassOptions, rule: Rule, m: Match):
        super().__init__(graph, options, rule, m.root)
        self.match = m

    @property
    def aggressive(self) -> bool:
        return bool(getattr(self.options, "aggressive_fusion", False))


def collect_rules() -> list[Rule]:
    """Every rule of the rule modules that exist, highest priority first (stable)."""
    rules: list[Rule] = []
    for mod in RULE_MODULES:
        try:
            module = importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{mod}":
                raise
            continue
        rules.extend(getattr(module, "RULES", ()))
    return by_priority(rules)


def rule_names() -> set[str]:
    return {r.name for r in collect_rules()}


class FusionPass:
    """Pass "fusion": apply fusion rules until none applies (see module doc)."""

    name = "fusion"

    def __init__(self, options: PassOptions, log: list | None = None,
                 rules: list[Rule] | None = None, max_rounds: int = 8, name: str = "fusion"):
        self.name = name          # another rule set ("aggressive_fusion", pipeline.py) runs under its own name
        rules = collect_rules() if rules is None else by_priority(rules)
        self.options, self.log, self.max_rounds = options, log, max_rounds
        self.rules = [r for r in rules if r.name not in options.disabled]
        for r in self.rules:
            if r.pattern is None:
                raise PassError(f"pass {name!r}: rule {r.name!r} has no pattern; rules rooted at op "
                                f"types run in a RuleSetPass (passes/rewrite.py)")

    def run(self, graph: Graph) -> PassResult:
        applied: dict[str, int] = {}
        declined: dict[str, int] = {}
        for _ in range(self.max_rounds):
            changed = False
            for rule in self.rules:
                roots = rule.pattern.ops
                for node in list(graph.nodes):
                    if node.graph is not graph or (node.domain, node.op_type) not in roots:
                        continue
                    m, value, ctx, first_decline = None, None, None, None
                    for cand in matches(rule.pattern, node):
                        cctx = FusionContext(graph, self.options, rule, cand)
                        got = verdict(rule, rule.check(cand, cctx))
                        if isinstance(got, Decline):
                            first_decline = first_decline or (cand, got)
                        elif got is not None:
                            m, value, ctx = cand, got, cctx
                            break
                    if m is None:
                        if first_decline is not None:
                            cand, got = first_decline
                            self._decline(rule, node, [n.name for n in cand.matched], str(got), declined)
                        else:
                            why = explain(rule.pattern, node)
                            if why is not None:
                                self._decline(rule, node, [node.name], f"blocked: {why}", declined)
                        continue
                    names = [n.name for n in m.matched]
                    fused = self._apply(graph, m, rule.rewrite(m, value, ctx), ctx)
                    applied[rule.name] = applied.get(rule.name, 0) + 1
                    self._record(rule.name, True, names, fused)
                    changed = True
                    if self.options.on_apply is not None:
                        self.options.on_apply(rule.name, names)
            if not changed:
                break
        return counts_result(applied, declined)

    # ------------------------------------------------------------------ helpers

    def _decline(self, rule: Rule, node: Node, names: list[str], reason: str, counts: dict) -> None:
        counts[rule.name] = counts.get(rule.name, 0) + 1
        self._record(rule.name, False, names, reason)

    def _record(self, rule: str, applied: bool, names: list[str], reason: str) -> None:
        """One record per (rule, nodes, outcome), one decline per (rule, root); a decline is
        dropped once the same rule fuses that root after all. Records are final: later passes do not filter them."""
        if self.log is None:
            return
        if applied:
            self.log[:] = [r for r in self.log if not (r["rule"] == rule and not r["applied"]
                                                        and r["nodes"][-1] in names)]
        for rec in self.log:   # a decline is about its root: keep the latest word on it
            if rec["rule"] == rule and rec["applied"] == applied and \
                    (rec["nodes"] == names or (not applied and rec["nodes"][-1] == names[-1])):
                rec["nodes"], rec["reason"] = names, reason
                return
        self.log.append({"rule": rule, "applied": applied, "nodes": names, "reason": reason, "final": True})

    def _apply(self, graph: Graph, m: Match, new, ctx: FusionContext) -> str:
        root = m.root
        news, renames = rewire(ctx, root, new)
        inputs: list[Value] = []
        for node in reversed(m.matched):
            if node.graph is graph and all(not o.uses and not o.is_graph_output for o in node.outputs):
                inputs.extend(v for v in node.inputs if v is not None)
                graph.remove(node)
        record_sources(news, list(m.matched), sweep_dead(graph, inputs), ctx.emitted)
        if root.graph is None:
            for value, name in renames:
                value.name = name
        made = next((r.producer for r in news if r is not None and r.producer is not None), None)
        if made is None:
            return ""
        return f"-> {made.name} ({made.domain + '::' if made.domain else ''}{made.op_type})"
