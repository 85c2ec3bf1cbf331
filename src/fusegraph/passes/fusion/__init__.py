"""Operator fusion: the pattern matcher (``pattern.py``), the engine and pass "fusion"
(``engine.py``), and the rule families (``rules_cnn.py``, ``rules_transformer.py``,
``rules_decoder.py``, ``rules_movement.py``): each a ``rule.Rule`` with a ``pattern`` (see
``passes/rule.py`` for what check returns).

Fused ops live in the op registry under domain ``fusegraph`` (``ops/fused_cnn.py``,
``ops/fused_transformer.py``, ``ops/fused_decoder.py``, ``ops/fused_movement.py``); this
package holds no kernel.
"""
from ..rule import Decline, Rule
from .engine import FusionContext, FusionPass, collect_rules
from .pattern import Const, Match, Pat, Var, explain, match

__all__ = ["Const", "Decline", "FusionContext", "FusionPass", "Match", "Pat", "Rule", "Var",
           "collect_rules", "explain", "match"]
