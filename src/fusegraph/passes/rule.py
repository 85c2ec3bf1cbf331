"""The one rule type of the rewriting passes: ``Rule``, its verdict ``Decline`` and its context
``RuleContext``. Two engines apply rules: ``rewrite.RuleSetPass`` (rules rooted at op types,
``ops=``) and ``fusion.engine.FusionPass`` (rules rooted at a ``fusion.pattern.Pat``,
``pattern=``). Both read a rule the same way:

- ``check(subject, ctx)`` looks and never mutates. ``subject`` is the root node (an ``ops``
  rule) or the pattern's ``Match`` (a ``pattern`` rule). It returns

  * ``None``: not applicable here (no match); nothing is recorded;
  * ``Decline(reason)``: the candidate is recognised but the rewrite would be wrong or
    useless; the engine counts it and records the reason (``report.fusions`` for the passes
    that log);
  * anything else: apply. The value (the pieces the rewrite needs, or ``True``) goes on to
    ``rewrite``. A plain ``str`` is refused with a ``PassError``, so a reason cannot be
    mistaken for a go.

- ``rewrite(subject, value, ctx)`` creates nodes through ``ctx.emit`` (inserted before the
  root, shapes inferred, tagged ``node.meta["rule"]``) and returns the values that replace
  the root's outputs (a Value, or a list with ``None`` for outputs left alone). The engine
  rewires users and removes what the rewrite left dead.

``priority``: larger first (stable), in both engines. ``doc``: the condition under which the
rewrite is exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import PassError
from ..ir import DType, Graph, Node, Value
from ..ops import infer_node, lookup
from .manager import PassOptions

if TYPE_CHECKING:
    from .fusion.pattern import Pat

FUSEGRAPH_DOMAIN = "fusegraph"


class Decline(str):
    """A check's "no": the candidate is recognised but not rewritten; the text says why."""


@dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[[Any, "RuleContext"], Any]          # None | Decline(reason) | value for rewrite
    rewrite: Callable[[Any, Any, "RuleContext"], Any]   # (subject, value, ctx) -> replacements
    ops: tuple[str, ...] = ()     # root op types ("fusegraph::Linear" for other domains), or
    pattern: "Pat | None" = None  # a pattern rooted at the node the rule replaces
    priority: int = 0             # larger first
    doc: str = ""                 # the condition under which the rewrite is exact

    def __post_init__(self):
        if not callable(self.check) or not callable(self.rewrite):
            raise TypeError(f"rule {self.name!r}: check and rewrite must be callables "
                            f"(Rule(name, check, rewrite, ops=... or pattern=...))")
        if isinstance(self.ops, str):
            raise TypeError(f"rule {self.name!r}: ops is a tuple of op types, not a string")
        if bool(self.ops) == (self.pattern is not None):
            raise ValueError(f"rule {self.name!r}: give either root op types (ops=) or a pattern (pattern=)")
        object.__setattr__(self, "ops", tuple(self.ops))


def verdict(rule: Rule, value: Any) -> Any:
    """``value`` (what ``rule.check`` returned) once it is known not to be a bare string."""
    if isinstance(value, str) and not isinstance(value, Decline):
        raise PassError(f"rule {rule.name!r}: check returned the string {value!r}; "
                        f"return Decline(reason) to decline, None when the rule does not apply")
    return value


def by_priority(rules) -> list[Rule]:
    """``rules``, highest priority first (stable)."""
    return sorted(rules, key=lambda r: -r.priority)


class RuleContext:
    """What a rule may use: the graph, the options, and node / constant constructors."""

    def __init__(self, graph: Graph, options: PassOptions, rule: Rule, root: Node):
        self.graph, self.options, self.rule, self.root = graph, options, rule, root
        self.emitted: list[Node] = []       # the nodes this rewrite made (``record_sources``)

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
        self.emitted.append(node)
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
