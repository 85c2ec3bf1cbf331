"""``precision="int8"``: post-training quantisation of a float32 model, before the pass
pipeline, so that the pipeline's int8 passes and kernels run it as they run a file onnxruntime
quantised (one int8 path).

``quantise(graph, config, report, calibration, stage)`` changes ``graph`` in place:

1. the light simplification (level O1: constant folding, BatchNormalization folded into the
   convolutions, ...), as onnxruntime's ``quant_pre_process`` does before its quantiser: the
   weights quantised are the ones the kernels will multiply by;
2. the plan (``passes/ptq_plan.py``): which products run int8 (``Config.op_precision`` entries
   of ``fp32`` keep theirs float32) and which activation tensors get a quantisation pair;
3. with ``calibration_inputs``: the ranges of those tensors on the float32 graph
   (``calibrate.py``, ``Config.calibration``; or ``ranges``, a previous quantisation's
   ``PTQResult.ranges`` of the same graph and method, where it covers every tensor to quantise:
   the ``precision="auto"`` search's candidates calibrate once), then the QuantizeLinear / DequantizeLinear
   pairs (``passes/qdq_insert.py``); without: the MatMul / Gemm products quantised
   dynamically (``passes/dynamic_insert.py``), and a ``UsageError`` when a convolution to
   quantise needs calibration inputs, or when nothing can be quantised.

It returns the ``PTQResult`` whose ``summary(graph)``, once the pipeline has run, is
``report.precision``: per product whether it runs int8 (an int8 op in the optimised graph:
``QConv`` / ``QLinear`` / ``QLinearDynamic``) or float32 and why (``op_precision``, a form the
int8 ops do not take, or the reason the int8 passes gave for not rewriting it, from
``report.fusions``), and under ``"int8"`` the mode, the calibration method and every
quantised activation's range, scale and zero point.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UsageError
from ..ir import Graph
from ..passes import PassManager, optimize
from ..passes.dynamic_insert import InsertDynamicQuant
from ..passes.ptq_plan import WHY_DYNAMIC_CONV, ProductPlan, plan_products, plan_tensors
from ..passes.qdq_insert import InsertQDQ
from .calibrate import calibrate, calibration_feeds

INT8_OPS = ("QConv", "QLinear", "QLinearDynamic")
WHY_NOT_LOWERED = "quantised, but the int8 passes left it float32"


@dataclass
class PTQResult:
    mode: str                                   # "static" | "dynamic"
    config: Any
    products: list[ProductPlan]
    calibration_inputs: int = 0
    activations: list[dict] = field(default_factory=list)
    ranges: dict[str, Any] = field(default_factory=dict)   # tensor name -> calibrate.Range (static)

    def summary(self, graph: Graph, report) -> dict:
        """``report.precision`` for the optimised ``graph``."""
        lowered = set()
        for n in graph.nodes:
            if n.domain == "fusegraph" and n.op_type in INT8_OPS:
                lowered.update([n.name, *n.meta.get("fused_from", ())])
        declined = {}
        for f in report.fusions:
            if not f.applied:
                for name in f.nodes:
                    declined.setdefault(name, f.reason)
        nodes, kept = [], []
        for p in self.products:
            int8 = p.int8 and (p.node.name in lowered or p.name in lowered)
            why, code = p.why, p.code
            if p.int8 and not int8:
                why = (f"{WHY_NOT_LOWERED}: {declined.get(p.node.name) or declined.get(p.name) or 'no rule matched'}"
                       if self.config.level == "O2" else
                       f"{WHY_NOT_LOWERED}: level {self.config.level} runs no int8 pass (the quantised graph as written)")
                code = "int8_not_lowered"
            rec = {"node": p.name, "op": p.node.op_type, "dtype": "int8" if int8 else "fp32", "class": "int8",
                   "why": why, "code": code}
            nodes.append(rec)
            if not int8:
                kept.append({"node": p.name, "op": p.node.op_type, "why": why, "code": code})
        by_dtype: dict[str, int] = {}
        for r in nodes:
            by_dtype[r["dtype"]] = by_dtype.get(r["dtype"], 0) + 1
        present = {x for n in graph.nodes for x in (n.name, n.op_type, *n.meta.get("fused_from", ()),
                                                     *n.meta.get("fused_types", ()))}
        present |= {p.name for p in self.products} | {p.node.op_type for p in self.products}
        ops = dict(self.config.op_precision)
        return {"policy": "int8", "op_precision": ops, "nodes": nodes, "by_dtype": by_dtype,
                "op_precision_unmatched": [k for k in ops if k not in present], "casts": 0, "casts_folded": 0,
                "kept_fp32": kept, "fp32_logits": [],
                "int8": {"mode": self.mode,
                         "calibration": self.config.calibration if self.mode == "static" else None,
                         "percentile": self.config.calibration_percentile
                         if self.mode == "static" and self.config.calibration == "percentile" else None,
                         "calibration_inputs": self.calibration_inputs,
                         "products_int8": by_dtype.get("int8", 0),
                         "activations": self.activations}}


def _run_pass(graph: Graph, p, report) -> None:
    from ..ops import infer_node
    report.passes.extend(PassManager([p], infer=infer_node).run(graph))


def quantise(graph: Graph, config, report, calibration: Any, stage: Callable[[str], None],
             ranges: dict[str, Any] | None = None) -> PTQResult:
    source = str(graph.meta.get("source", graph.name))
    imported = {n.name for n in graph.nodes}
    feeds = calibration_feeds(graph, calibration) if calibration is not None else None
    light = config.replace(level="O1", precision="fp32", op_precision=(), calibration="minmax",
                           calibration_percentile=99.999)
    optimize(graph, light, report)
    dynamic = feeds is None
    products = plan_products(graph, config.op_precision, imported, dynamic)
    if dynamic:
        convs = [p.name for p in products if p.why == WHY_DYNAMIC_CONV]
        if convs:
            raise UsageError(f"{source}: precision='int8' without calibration_inputs quantises MatMul / Gemm "
                             f"products dynamically; its convolution(s) {', '.join(convs[:3])}"
                             f"{' ...' if len(convs) > 3 else ''} need calibration_inputs (a list of feeds), or "
                             f"keep them float32 with op_precision={{'Conv': 'fp32'}}")
    if not any(p.int8 for p in products):
        whys = "; ".join(f"{p.name} ({p.node.op_type}): {p.why}" for p in products[:3]) or "it has no product"
        raise UsageError(f"{source}: precision='int8' finds nothing to quantise ({whys})")
    result = PTQResult("dynamic" if dynamic else "static", config, products)
    if dynamic:
        _run_pass(graph, InsertDynamicQuant(products), report)
        return result
    tensors = plan_tensors(graph, products)
    if ranges is None or any(name not in ranges for name in tensors.observe):
        stage("calibration")
        ranges = calibrate(graph, config, tensors.observe, feeds)
    result.ranges = dict(ranges)
    insert = InsertQDQ(products, tensors, {n: (r.lo, r.hi) for n, r in ranges.items()})
    _run_pass(graph, insert, report)
    result.calibration_inputs = len(feeds)
    for name in list(tensors.observe) + list(tensors.same_as):
        r = ranges[tensors.root(name)]
        scale, zp = insert.params[name]
        result.activations.append({"tensor": name, "scale": scale, "zero_point": zp, "lo": r.lo, "hi": r.hi,
                                   "min": r.min, "max": r.max, "same_as": tensors.same_as.get(name)})
    return result
