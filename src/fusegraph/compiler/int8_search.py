"""int8 candidates of one model: the products quantised, some kept float32, each candidate a
real compile; what ``precision="auto"`` (its int8 search) and ``fusegraph bisect --precision
int8`` (``tools/int8_bisect.py``) measure.

``Int8Candidates(graph, config, calibration)`` holds an imported, inferred graph (never
changed: each compile quantises its own copy) and compiles it at ``precision="int8"`` with a
set of products kept float32 (``compile(kept)``: ``Config.op_precision`` fp32 entries by the
products' imported names, the user's own fp32 entries on top). The first static compile's
calibrated ranges are reused by the next ones (``int8_ptq.quantise(ranges=...)``): keeping a
product float32 only removes tensors from those to quantise, and a tensor's range does not
depend on what else is quantised, so the candidates calibrate once.

Hooks rounding a node's outputs in the float32 model (the bf16 tools' sensitivity,
``precision_auto.sensitivity``) cannot stand for int8: the int8 graph's nodes are other nodes
(``QConv``, ``QLinear``), its weights are quantised as well, and its activations are quantised
at the product's input. So every measurement here is a compile of the quantised graph run on
the inputs:

- ``alone(names, feeds, want)``: each product's sensitivity, the outputs' relative L2 error when
  only that product is int8 (every other one kept float32);
- ``choose(feeds, want, budget, time_us)``: the products ranked by ``precision_auto.rank``
  (squared error per microsecond of estimated work) and the smallest k, the number of
  first-ranked products kept float32, whose candidate is within ``budget`` (galloping 1, 2, 4
  ..., then a bisection, as the bf16 search does; k = all of them is the float32 model).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

from ..ir import Graph
from ..ir.serialize import copy_graph
from .accuracy import worst_error

BUDGET_WHY = "kept float32: among the highest int8 error per microsecond, the accuracy budget needs it"


def feeds_error(model, feeds: list[dict], want: list[dict]) -> float:
    """The largest relative L2 error of any float output on any input (NaN: infinite)."""
    return max(worst_error(model.run(f), w) for f, w in zip(feeds, want))


@dataclass
class Int8Choice:
    """The int8 search's answer: ``kept`` (imported product names kept float32, most sensitive
    first), the error of that candidate, the candidates measured, and per product its
    sensitivity and estimated time."""
    kept: list[str]
    error: float
    int8_error: float                           # every product int8
    share: float                                # of the products' estimated time left in int8
    products: list[str] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)
    time_us: dict[str, float] = field(default_factory=dict)
    steps: dict[int, float] = field(default_factory=dict)    # k -> error


class Int8Candidates:
    def __init__(self, graph: Graph, config, calibration: Any):
        self.graph = graph
        self.user = tuple((k, v) for k, v in config.op_precision if v == "fp32")
        self.config = config.replace(precision="int8", op_precision=self.user, accuracy_budget=1e-2)
        self.calibration = calibration
        self.ranges: dict | None = None
        self.first = None               # (PTQResult, report.precision) of the all-int8 compile

    def compile(self, kept=()):
        """The model with the products named in ``kept`` float32 (a ``UsageError`` where that
        leaves nothing to quantise), and its ``PTQResult``."""
        from ..passes import optimize
        from ..report import CompileReport
        from .int8_ptq import quantise
        from .planning import plan_and_bind
        g = copy_graph(self.graph)
        cfg = self.config.replace(op_precision=self.user + tuple((n, "fp32") for n in kept))
        report = CompileReport(model=str(g.meta.get("source", g.name)), nodes_imported=len(g.nodes))
        ptq = quantise(g, cfg, report, self.calibration, lambda name: None, self.ranges)
        if ptq.mode == "static" and self.ranges is None:
            self.ranges = ptq.ranges
        optimize(g, cfg, report)
        report.precision = ptq.summary(g, report)
        if self.first is None and not kept:
            self.first = (ptq, report.precision)
        return plan_and_bind(g, cfg, report, None), ptq

    def int8_products(self) -> list[dict]:
        """``report.precision["nodes"]`` rows of the products the all-int8 compile runs int8."""
        if self.first is None:
            self.compile()[0].close()
        return [r for r in self.first[1]["nodes"] if r["dtype"] == "int8"]

    def measure(self, kept, feeds: list[dict], want: list[dict]) -> float:
        model = self.compile(kept)[0]
        try:
            return feeds_error(model, feeds, want)
        finally:
            model.close()

    def alone(self, names: list[str], feeds: list[dict], want: list[dict]) -> dict[str, float]:
        """name -> the outputs' error when only that product of ``names`` is int8."""
        return {name: self.measure([n for n in names if n != name], feeds, want) for name in names}

    def product_times(self, names: list[str], costs) -> dict[str, float]:
        """name -> the product's estimated one-thread time (``CostModel.product_us``)."""
        ptq = self.first[0]
        nodes = {p.name: p.node for p in ptq.products}
        return {n: costs.product_us(nodes[n]) if n in nodes else 1.0 for n in names}

    def choose(self, feeds: list[dict], want: list[dict], budget: float, costs, rank) -> Int8Choice:
        """``rank(sensitivity, time_us)``: product names, the first to keep float32 first
        (``precision_auto.rank``)."""
        names = [r["node"] for r in self.int8_products()]
        steps = {0: self.measure([], feeds, want)}
        time_us = self.product_times(names, costs)
        total = sum(time_us.values()) or 1.0
        choice = Int8Choice([], steps[0], steps[0], 1.0, names, {}, time_us, steps)
        if steps[0] <= budget or not names:
            return choice
        choice.sensitivity = self.alone(names, feeds, want)
        ranked = rank(choice.sensitivity, time_us)

        def within(k: int) -> bool:
            if k not in steps:
                # k = all: the float32 model, the reference itself (nothing left to quantise)
                steps[k] = 0.0 if k >= len(ranked) else self.measure(ranked[:k], feeds, want)
                gc.collect()
            return steps[k] <= budget
        lo, hi, step = 1, len(ranked), 1          # the smallest k in [lo, hi] within budget; hi always is
        while step < hi:
            if within(step):
                hi = step
                break
            lo, step = step + 1, step * 2
        while lo < hi:
            mid = (lo + hi) // 2
            if within(mid):
                hi = mid
            else:
                lo = mid + 1
        within(lo)
        choice.kept = ranked[:lo]
        choice.error = steps[lo]
        choice.share = sum(time_us[n] for n in ranked[lo:]) / total
        return choice
