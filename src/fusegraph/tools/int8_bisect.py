"""int8 bisect: the products whose quantisation costs a model the most accuracy
(``fusegraph bisect MODEL --precision int8``).

``int8_ranking(model, config, calibration, feeds, progress) -> Int8Ranking`` (which
``precision_bisect.precision_bisect(precision="int8")`` presents as its bf16 ranking):

1. the reference: the model compiled at float32, its outputs on ``feeds`` (default: random
   inputs of its specs, seeds other than the calibration's);
2. the model compiled at ``precision="int8"`` (``compiler/int8_search.Int8Candidates``): its
   whole-model error (the largest relative L2 error of any float output against the
   reference) and, from ``report.precision["nodes"]``, every product it runs int8;
3. each such product's sensitivity: the outputs' error when only that product is int8 (every
   other one kept float32 through ``Config.op_precision``), one compile per product, the
   calibration done once.

The bf16 bisect's hooks (rounding one node's outputs in the float32 model, indexed by that
compile's order) are not used: the int8 graph's nodes are other nodes (``QConv``, ``QLinear``),
and quantisation changes a product's weights and its input, not its output. Calibration: the
``calibration`` feeds given; without them, ``int8_inputs.default_calibration`` (random inputs
of the model's specs for a model with convolutions, dynamic quantisation for one of MatMul /
Gemm products only, as ``precision="int8"`` does), said in ``PrecisionBisectResult.calibration``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Int8Ranking:
    model: str
    error: float                      # every product int8, against float32
    rows: list[dict]                  # report.precision["nodes"] rows of the int8 products, most sensitive first
    sensitivity: dict[str, float]     # product name -> the error with only it int8
    calibration: str                  # what the activations' ranges were calibrated on


def int8_ranking(model: Any, config=None, calibration: list[dict] | None = None, feeds: dict | None = None,
                 progress: bool = False) -> Int8Ranking:
    from ..compiler.driver import check_op_precision, import_model
    from ..compiler.int8_search import Int8Candidates
    from ..config import Config
    from ..ir.serialize import copy_graph
    from ..ops import infer_graph
    from ..passes import optimize
    from ..report import CompileReport
    from ..runtime.feeds import random_feeds
    from ..runtime.threads import intra_op_threads
    from ..compiler.planning import plan_and_bind
    from .bisect import StepProgress
    from .int8_inputs import default_calibration

    config = config or Config()
    graph = import_model(model)
    infer_graph(graph)
    check_op_precision(graph, config)
    name = str(graph.meta.get("source", graph.name))
    calibration, how = default_calibration(graph, calibration)
    feeds = feeds if feeds is not None else random_feeds(graph.inputs, 0)
    with StepProgress(progress) as tick, intra_op_threads(config.threads):
        tick("fp32 reference")
        fp32 = config.replace(precision="fp32", op_precision=(), calibration="minmax",
                              calibration_percentile=99.999, accuracy_budget=1e-2)
        base = copy_graph(graph)
        optimize(base, fp32, CompileReport())
        reference = plan_and_bind(base, fp32, CompileReport(), None)
        try:
            want = [reference.run(feeds)]
        finally:
            reference.close()
        tick("int8 model")
        candidates = Int8Candidates(graph, config, calibration)
        error = candidates.measure([], [feeds], want)
        rows = candidates.int8_products()
        names = [r["node"] for r in rows]
        tick(f"sensitivity of {len(names)} product(s)")
        cost = candidates.alone(names, [feeds], want) if len(names) > 1 else {n: error for n in names}
    rows = sorted(rows, key=lambda r: -cost[r["node"]])
    return Int8Ranking(name, error, rows, cost, how)
