"""Operator fusion: the pattern matcher (``pattern.py``), the engine and pass "fusion"
(``engine.py``), and the rule families (``rules_cnn.py``, ``rules_transformer.py``).

Fused ops live in the op registry under domain ``fusegraph`` (``ops/fused_cnn.py``,
``ops/fused_transformer.py``); this package holds no kernel.
"""
from .engine import FusionContext, FusionPass, FusionRule, collect_rules
from .pattern import Const, Match, Pat, Var, explain, match

__all__ = ["Const", "FusionContext", "FusionPass", "FusionRule", "Match", "Pat", "Var",
           "collect_rules", "explain", "match"]
