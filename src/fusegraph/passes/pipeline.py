"""Named pipelines, as data: which passes run at O0 / O1 / O2, in which order, and why.

A pipeline is a list of steps; a step is a pass name or a ``Group`` (a fixed-point group:
its passes repeat until none changes the graph). ``build_pipeline`` turns names into pass
objects with their options, leaving out disabled passes and disabled rules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import ConfigError
from . import algebra, batchnorm, collapse, conv_affine, conv_before_resize, noop, replace_linear, replace_matmul
from . import dynamic_quant, qdq_propagate, qlinear_ops, quantize_qdq, replace_reduce, replace_rnn, shape_chain, table_gather
from .cse import CommonSubexpressionElimination
from .dce import DeadCodeElimination
from .fold import ConstantFold, FoldLog
from .fold_casts import FoldCasts
from .fusion.engine import FusionPass, rule_names as fusion_rule_names
from .fusion.rules_aggressive import RULES as AGGRESSIVE_RULES
from .layout import LayoutPass
from .precision import PrecisionPass
from .manager import FixedPoint, PassOptions
from .rewrite import RuleSetPass
from .shape_refine import ShapeRefine


@dataclass(frozen=True)
class Group:
    name: str
    passes: tuple[str, ...]
    max_iterations: int = 16


# name -> rule family, for every pass built from rewrite rules
RULE_FAMILIES = {
    "shape_chain_fold": shape_chain.RULES,
    "table_gather": table_gather.RULES,
    "noop_elimination": noop.RULES,
    "algebraic_simplify": algebra.RULES,
    "collapse_chains": collapse.RULES,
    "batchnorm_to_affine": batchnorm.RULES,
    "conv_affine_fold": conv_affine.RULES,
    "conv_before_resize": conv_before_resize.RULES,
    "replace_linear": replace_linear.RULES,
    "replace_matmul": replace_matmul.RULES,
    "replace_reduce": replace_reduce.RULES,
    "replace_rnn": replace_rnn.RULES,
    "quantize_qdq": quantize_qdq.RULES,
    "dynamic_quant": dynamic_quant.RULES,
    "qlinear_ops": qlinear_ops.RULES,
    "qdq_propagate": qdq_propagate.RULES,
    "qdq_affine": qdq_propagate.AFFINE_RULES,
    "qdq_grid_output": qdq_propagate.GRID_RULES,
}
REPLACEMENT_PASSES = frozenset({"conv_before_resize", "replace_linear", "replace_matmul", "replace_reduce",
                                "replace_rnn", "quantize_qdq", "dynamic_quant", "qlinear_ops", "qdq_propagate",
                                "qdq_affine", "qdq_grid_output"})
OTHER_PASSES = ("constant_fold", "shape_refine", "dce", "cse", "fusion", "aggressive_fusion", "layout", "fold_casts")
# passes that run only when their option is on (``PassOptions`` field of the same name)
OPTIONAL_PASSES = frozenset({"aggressive_fusion"})

QUANTISED = Group("quantised", (
    "quantize_qdq",         # QDQ products -> int8 ops, before folding turns DQ(weight) into float weights
    "dynamic_quant",        # quantize_dynamic's DynamicQuantizeLinear -> MatMulInteger -> scale products -> QLinearDynamic
    "qlinear_ops",          # QLinearConv / QLinearMatMul / ConvInteger / MatMulInteger -> the same int8 ops
    "qdq_propagate",        # int8 values straight from one int8 op to the next (sinks, cancels, residuals)
    "dce",
))

SIMPLIFY = Group("simplify", (
    "shape_chain_fold",     # first: turns Shape reads of static dims into constants ...
    "constant_fold",        # ... which folding then evaluates, cascading through the chain
    "shape_refine",         # folded constants make downstream shapes static: re-infer them
    "noop_elimination",     # after folding, so Reshape / Expand targets are constants
    "table_gather",         # embedding rows a constant's ids pick: a view of the table, not a copy
    "algebraic_simplify",
    "collapse_chains",
    "batchnorm_to_affine",  # before conv_affine_fold, which consumes its Mul / Add
    "conv_affine_fold",
    "cse",                  # merged nodes expose more chains to the rules above
    "dce",                  # last: drops what the rewrites above left dead
))

REPLACE = Group("replace", (
    "conv_before_resize",   # after simplify folded BatchNorm into the convolutions it splits
    "replace_reduce",       # Expand+Reduce, one-input Sum -> Identity ...
    "replace_linear",       # before replace_matmul: Reshape(Linear(Reshape)) needs the Linear
    "replace_matmul",
    "replace_rnn",          # LSTM weights in the gate order the recurrent kernels read
    "noop_elimination",     # ... removes the Identity replace_reduce made
    "constant_fold",
    "dce",
))

FUSE = Group("fuse", (
    "fusion",               # after simplify / replace: rules match the canonical forms they leave
    "aggressive_fusion",    # Config.aggressive_fusion only: after the default rules, whose fused
                            # forms it packs and recomputes (the group repeats: they see its result)
    "qdq_propagate",        # again, now that simplify removed what stood between a DQ and a move (a zero bias)
    "qdq_affine",           # Q(DQ(x) op c ...) -> Requantize with steps: after BatchNorm became a chain
    "qdq_grid_output",      # DQ(QConv / QLinear / QMatMul) -> the product writing float32 on its grid: after qdq_affine
    "cse",                  # one tensor for the equal weights the rewrites made per node (a shared layer's)
    "dce",                  # drops what fused patterns left dead
))

LAYOUT = Group("layout", (
    "layout",               # after fusion: it lays out what the fused convolutions read and write
))

PIPELINES: dict[str, list] = {
    "O0": [],                    # nothing: the graph as imported (the numerical reference)
    "O1": [SIMPLIFY],            # simplification only
    "O2": [QUANTISED,   # first: it reads the model's DQ / Q nodes as written
           SIMPLIFY, REPLACE, SIMPLIFY,   # replacement last, then clean up once more
           FUSE,        # its patterns expect BN folded, constants folded, Linear replaced
           LAYOUT],     # last: memory layout of the final nodes' outputs
}


def known_names() -> set[str]:
    names = set(RULE_FAMILIES) | set(OTHER_PASSES)
    for rules in RULE_FAMILIES.values():
        names.update(r.name for r in rules)
    return names | fusion_rule_names() | {r.name for r in AGGRESSIVE_RULES}


def build_pipeline(level: str, options: PassOptions, fold_log: FoldLog,
                   rewrite_log: list | None = None, precision_log: list | None = None) -> list:
    """Pass objects for ``level``; ``options.disabled`` names passes or rules to leave out.
    Reduced precision (``options.precision`` / ``op_precision``) is a request, not an
    optimisation: its pass runs last at every level, and cannot be disabled."""
    if level not in PIPELINES:
        raise ConfigError(f"unknown pipeline level {level!r}; known: {', '.join(PIPELINES)}")
    unknown = set(options.disabled) - known_names()
    if unknown:
        raise ConfigError(f"Config.disabled_passes names unknown passes or rules: {sorted(unknown)}; "
                          f"known: {', '.join(sorted(known_names()))}")
    factories: dict[str, Callable] = {
        "constant_fold": lambda: ConstantFold(options, fold_log),
        "shape_refine": lambda: ShapeRefine(options),
        "dce": lambda: DeadCodeElimination(options),
        "cse": lambda: CommonSubexpressionElimination(options),
        "fusion": lambda: FusionPass(options, rewrite_log),
        "aggressive_fusion": lambda: FusionPass(options, rewrite_log, AGGRESSIVE_RULES, name="aggressive_fusion"),
        "layout": lambda: LayoutPass(options),
    }
    for name, rules in RULE_FAMILIES.items():
        log = rewrite_log if name in REPLACEMENT_PASSES else None
        factories[name] = lambda name=name, rules=rules, log=log: RuleSetPass(name, rules, options, log)

    def make(names):
        return [factories[n]() for n in names if n not in options.disabled
                and (n not in OPTIONAL_PASSES or getattr(options, n))]

    steps = []
    for step in PIPELINES[level]:
        if isinstance(step, Group):
            passes = make(step.passes)
            if passes:
                steps.append(FixedPoint(step.name, passes, step.max_iterations))
        else:
            steps.extend(make([step]))
    if options.precision != "fp32" or options.op_precision:
        steps.extend(precision_steps(options.precision, options.op_precision, options.disabled, precision_log))
    return steps


def precision_steps(precision: str, op_precision, disabled=frozenset(), log: list | None = None) -> list:
    """The pipeline's tail under reduced precision: the precision pass, then the folding of
    the Casts it inserted (unless disabled). The auto search runs exactly these on its
    candidates, so what it measures is what it builds."""
    steps = [PrecisionPass(precision, op_precision, log)]
    if "fold_casts" not in disabled:
        steps.append(FoldCasts())
    return steps
