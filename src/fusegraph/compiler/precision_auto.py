"""``precision="auto"``: int8 where it fits (below), else the bf16 policy, with the ops whose
reduced precision costs the most moved back to float32 until the outputs stay within
``Config.accuracy_budget``.

int8 first (``int8_search.py``), where ``calibration_inputs`` are given (the activations'
ranges come from them; random inputs would calibrate to noise), the CPU sums int8 products
exactly (VNNI / AMX: ``runtime.backends.int8_declined``), the inputs' shapes are static (no
per-shape compile, which would re-run the bf16 pipeline on the quantised graph) and the user's
``op_precision`` entries are all fp32: the products (Conv / MatMul / Gemm with constant
weights) quantised as ``precision="int8"`` does; within budget on the calibration inputs, that
is the answer; else each product's error alone in int8 ranks them (squared error per
microsecond, ``rank``) and the smallest number of first-ranked products kept float32 that is
within budget is searched for, as below for bf16. When that leaves at least
``MIN_INT8_SHARE`` of the products' estimated time in int8 (a judgement, not a measurement:
each float32 island costs quantise / dequantise work around it), the int8 model is built
(``report.precision`` is ``int8_ptq``'s per-product summary, int8 or fp32 and why, with the
search under ``["auto"]``); otherwise the bf16 search below runs, and ``["auto"]["int8"]`` says
why int8 was not chosen. A product leaves int8 for float32, not bf16: an int8 compile runs its
float ops in float32 (its pipeline has no bf16 policy).

``search(graph, config, report, calibration, stage)`` optimises ``graph`` in place at the
chosen policy and records the search in ``report.precision["auto"]``:

1. the reference: a copy of the imported graph compiled at float32; its outputs on the
   calibration inputs (given, or two random inputs of the model's specs);
2. the candidate with the whole bf16 policy; within budget (the largest relative L2 error of
   any output on any calibration input), it is the answer;
3. otherwise each reduced node's sensitivity: the outputs' error when only that node's
   outputs are rounded to bf16 in the float32 reference (one hooked run per node), and its
   estimated time (``CostModel.product_us``: flops or, for a one-row product, its weights'
   bytes). Errors of independent roundings add in quadrature, and bf16 roughly halves either
   time, so a node's claim on float32 is its squared error per microsecond: the nodes are
   ranked by ``sensitivity ** 2 / time`` (``rank``), and a cheap sensitive node goes back to
   float32 before an expensive one of the same sensitivity;
4. a search over k, the number of first-ranked nodes kept in float32 (k = 1, 2, 4 ... until
   within budget, then a bisection; each step a bind and a run on the calibration inputs of a
   copy put through the pipeline's precision tail, ``passes.pipeline.precision_steps``, the
   precision pass and the cast folding, as the final compile does: what is measured is what
   is built), for the smallest k within budget (k = all of them is the float32 model, which
   always is);
5. when the nodes that k leaves in bf16 hold less than ``MIN_BF16_SHARE`` of the estimated
   product time, the float32 model instead: that little bf16 work does not pay for the casts
   around it (measured on AlexNet and ShuffleNet, which ran no faster than their float32
   models: benchmarks/RESULTS.md, "Mixed precision against OpenVINO bf16 (issue 16)").

Before all this, a device without bf16 arithmetic (``bf16_declined``: a CPU whose oneDNN has no
bf16 product, AVX2 only; a GPU without bf16) gets the float32 model, with the reason in
``report.precision["auto"]["declined"]``: there bf16 runs as float32 over bf16 storage, slower
than float32 and larger once loaded (benchmarks/RESULTS.md, "a CPU without bf16 arithmetic"), as
OpenVINO's default precision is bf16 only on CPUs with bf16 arithmetic.

The user's own ``op_precision`` entries hold in every candidate. Nothing here is a pass: it
drives the compiler, as ``tools/bisect.py`` does.
"""
from __future__ import annotations

import gc
import math
from typing import Any, Callable

import torch

from ..errors import UsageError
from ..ir import Graph
from ..ir.serialize import copy_graph
from ..plan.cost import CostModel
from ..runtime.backends import bf16_declined, int8_declined
from .accuracy import worst_error
from .calibrate import calibration_feeds

CALIBRATION_INPUTS = 2
MIN_BF16_SHARE = 0.2
MIN_INT8_SHARE = 0.5
BUDGET_WHY = "among the highest error per microsecond in bf16: the budget needs it"


def _int8_refused(graph: Graph, config, calibration) -> str | None:
    """Why precision "auto" does not try int8 on ``graph`` (None: it does)."""
    from .model import device_of
    from .specialize import specialization_kind
    if calibration is None:
        return "no calibration_inputs: int8 needs them for the activations' ranges"
    why = int8_declined(device_of(config))
    if why is not None:
        return why
    if specialization_kind(graph, config) is not None:
        return "the model compiles per input shape (symbolic dims or dynamic_batch): int8 needs static shapes here"
    other = [f"{k}={v}" for k, v in config.op_precision if v != "fp32"]
    if other:
        return f"op_precision asks for {', '.join(other)}: an int8 compile runs its float ops in float32"
    return None


def _search_int8(graph: Graph, config, report, feeds: list[dict], stage) -> dict:
    """The int8 search (module doc); builds ``graph`` in int8 and returns its record when chosen
    (``"chosen": True``), else returns what it measured and why int8 was not chosen."""
    from ..passes import optimize
    from ..report import CompileReport
    from .int8_ptq import quantise
    from .int8_search import BUDGET_WHY as INT8_BUDGET_WHY, Int8Candidates
    from .model import device_of
    from .planning import plan_and_bind
    stage("int8 search")
    fp32 = config.replace(precision="fp32", op_precision=(), accuracy_budget=1e-2)
    base = copy_graph(graph)
    optimize(base, fp32, CompileReport())
    reference = plan_and_bind(base, fp32, CompileReport(), None)
    try:
        want = [reference.run(f) for f in feeds]
    finally:
        reference.close()
    candidates = Int8Candidates(graph, config, feeds)
    try:
        choice = candidates.choose(feeds, want, config.accuracy_budget, CostModel.for_device(device_of(config)), rank)
    except UsageError as exc:            # nothing the int8 passes can quantise
        return {"chosen": False, "why": str(exc)}
    record = {"chosen": False, "error": choice.error, "int8_error": choice.int8_error,
              "int8_time_share": choice.share, "products": len(choice.products),
              "kept_fp32": [{"node": n, "sensitivity": choice.sensitivity.get(n, math.inf),
                             "time_us": choice.time_us[n], "why": INT8_BUDGET_WHY, "code": "auto_budget"}
                            for n in choice.kept],
              "steps": [{"kept": k, "error": e} for k, e in sorted(choice.steps.items())], "why": None}
    if not choice.products:
        record["why"] = "no product of the model runs int8"
        return record
    if choice.share < MIN_INT8_SHARE:
        record["why"] = (f"the budget leaves {choice.share:.0%} of the products' estimated time in int8, under "
                         f"{MIN_INT8_SHARE:.0%}: the bf16 search instead")
        return record
    cfg = candidates.config.replace(op_precision=candidates.user + tuple((n, "fp32") for n in choice.kept))
    ranges = candidates.ranges
    candidates = None
    gc.collect()
    ptq = quantise(graph, cfg, report, feeds, stage, ranges)
    optimize(graph, cfg, report)
    prec = ptq.summary(graph, report)
    kept = set(choice.kept)
    for rows in (prec["nodes"], prec["kept_fp32"]):
        for r in rows:
            if r["node"] in kept:
                r["why"], r["code"] = INT8_BUDGET_WHY, "auto_budget"
    prec["op_precision"] = dict(config.op_precision)
    prec["op_precision_unmatched"] = [k for k in prec["op_precision_unmatched"] if k in prec["op_precision"]]
    prec["policy"] = "auto"
    record["chosen"] = True
    prec["auto"] = {"budget": config.accuracy_budget, "calibration_inputs": len(feeds), "error": choice.error,
                    "bf16_error": None, "bf16_time_share": 0.0, "fp32_fallback": None, "declined": None,
                    "chosen": "int8", "kept_fp32": record["kept_fp32"], "steps": record["steps"], "int8": record}
    report.precision = prec
    return record


def _declined(graph: Graph, config, report, why: str) -> None:
    """The float32 model (the user's own ``op_precision`` entries hold) and why."""
    from ..passes import optimize
    from ..passes.precision import PrecisionPass, precision_summary
    fp32 = config.replace(precision="fp32", accuracy_budget=1e-2)
    optimize(graph, fp32, report)
    if not report.precision:          # no user entry: the pipeline ran no precision pass; its
        log: list = []                # per-node log, from a copy (the graph stays as built)
        PrecisionPass("fp32", (), log).run(copy_graph(graph))
        report.precision = precision_summary(graph, fp32, log)
    report.precision["policy"] = "auto"
    report.precision["auto"] = {
        "budget": config.accuracy_budget, "calibration_inputs": 0, "error": None, "bf16_error": None,
        "bf16_time_share": 0.0, "fp32_fallback": None, "declined": why, "kept_fp32": [], "steps": [],
        "chosen": "fp32"}


def _feeds(graph: Graph, calibration) -> list[dict]:
    if calibration is None:
        from ..runtime.feeds import random_feeds
        return [random_feeds(graph.inputs, seed=i) for i in range(CALIBRATION_INPUTS)]
    return calibration_feeds(graph, calibration)


def _error(model, feeds: list[dict], want: list[dict]) -> float:
    """The largest relative L2 error of any float output on any input (NaN: infinite)."""
    return max(worst_error(model.run(f), w) for f, w in zip(feeds, want))


def sensitivity(model, feeds: dict, want: dict, names: list[str], dtype: torch.dtype) -> dict[str, float]:
    """node name -> the outputs' relative L2 error when only that node's outputs are rounded to
    ``dtype``: one hooked run of the float32 ``model`` per node (its end-to-end cost, which a
    deep net's later layers amplify less than its early ones)."""
    order = {name: i for i, name in enumerate(model.plan.order)}
    out: dict[str, float] = {}
    for name in names:
        index = order.get(name)
        if index is None:
            continue

        def hook(i, phase, outputs, index=index):
            if i == index and phase == 1:
                for t in outputs:
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        t.copy_(t.to(dtype))
        out[name] = worst_error(model.run(feeds, hook=hook), want)
    return out


def rank(sensitivity: dict[str, float], time_us: dict[str, float]) -> list[str]:
    """Node names, the first to keep in float32 first: the highest squared error per
    microsecond (an unmeasured node's error counts as infinite, an unknown time as 1 us)."""
    def claim(name: str) -> float:
        return sensitivity.get(name, math.inf) ** 2 / max(time_us.get(name, 0.0), 1.0)
    return sorted(sensitivity.keys() | time_us.keys(), key=lambda n: (-claim(n), n))


def _model_names(imported: Graph, optimised: Graph) -> dict[str, str]:
    """Optimised node name -> the imported node name ``op_precision`` can use for it (its own,
    or the first node fused into it)."""
    known = {n.name for n in imported.nodes}
    out = {}
    for n in optimised.nodes:
        key = n.name if n.name in known else next((x for x in n.meta.get("fused_from", ()) if x in known), None)
        if key is not None:
            out[n.name] = key
    return out


def search(graph: Graph, config, report, calibration: Any, stage: Callable[[str], None]) -> None:
    from .model import CompiledModel, device_of
    from .planning import plan_execution
    from ..passes import optimize
    from ..passes.pipeline import precision_steps
    from ..passes.precision_policy import REDUCE, Reason
    from ..report import CompileReport

    int8 = {"chosen": False, "why": _int8_refused(graph, config, calibration)}
    if int8["why"] is None:
        int8 = _search_int8(graph, config, report, _feeds(graph, calibration), stage)
        if int8["chosen"]:
            return
    why = bf16_declined(device_of(config))
    if why is not None:
        _declined(graph, config, report, why)
        report.precision["auto"]["int8"] = int8
        return
    feeds = _feeds(graph, calibration)
    user = tuple(config.op_precision)
    fp32 = config.replace(precision="fp32", op_precision=(), accuracy_budget=1e-2)
    base = copy_graph(graph)
    optimize(base, fp32, CompileReport())          # every pass but precision, once

    def bind(g, cfg):
        return CompiledModel(g, cfg, (r := CompileReport()), plan_execution(g, cfg, r))

    reference = bind(copy_graph(base), fp32)
    want = [reference.run(f) for f in feeds]
    candidates: dict[int, float] = {}

    def candidate(kept: list[str]):
        g, log = copy_graph(base), []
        for step in precision_steps("bf16", user + tuple((n, "fp32") for n in kept), config.disabled_passes, log):
            step.run(g)
        model = bind(g, fp32)
        candidates[len(kept)] = _error(model, feeds, want)
        return model, log

    stage("precision search")
    full, log = candidate([])
    budget = config.accuracy_budget
    ranked: list[str] = []
    cost: dict[str, float] = {}
    time_us: dict[str, float] = {}
    k = budget_kept = 0                 # budget_kept: the k the budget asked for (k is larger after a fallback)
    fallback = None

    def share(names) -> float:
        return sum(time_us[n] for n in names) / sum(time_us.values()) if time_us else 1.0

    if candidates[0] > budget:
        keys = _model_names(graph, full.graph)
        nodes = {n.name: n for n in full.graph.nodes}
        reduced = [r["node"] for r in log if r["dtype"] != "fp32" and r["class"] == REDUCE and r["node"] in keys]
        measured = sensitivity(reference, feeds[0], want[0], reduced, torch.bfloat16)
        cost = {keys[n]: measured.get(n, math.inf) for n in reduced}
        costs = CostModel.for_device(device_of(config))
        time_us = {keys[n]: costs.product_us(nodes[n]) for n in reduced}
        ranked = rank(cost, time_us)
        lo, hi = 1, len(ranked)          # the smallest k in [lo, hi] within budget; hi always is
        step = 1                         # galloping first: a few ops often carry most of the error
        while step < hi:
            candidate(ranked[:step])
            if candidates[step] <= budget:
                hi = step
                break
            lo, step = step + 1, step * 2
        while lo < hi:
            mid = (lo + hi) // 2
            candidate(ranked[:mid])
            if candidates[mid] <= budget:
                hi = mid
            else:
                lo = mid + 1
        k = budget_kept = lo
        if k < len(ranked) and share(ranked[k:]) < MIN_BF16_SHARE:
            fallback, k = share(ranked[k:]), len(ranked)
        if k not in candidates:          # every reduced node kept: the bound, never measured
            candidate(ranked[:k])
    kept = ranked[:k]
    fallback_why = None if fallback is None else (
        f"the budget leaves {fallback:.0%} of the estimated product time in bf16, under {MIN_BF16_SHARE:.0%}: "
        "too little to pay for its casts")
    full = reference = base = None
    gc.collect()          # the candidates' bound kernels and packed weights go before the real bind
    optimize(graph, fp32.replace(precision="bf16", op_precision=user + tuple((n, "fp32") for n in kept)), report)
    report.precision["policy"] = "auto"
    report.precision["auto"] = {
        "budget": budget, "calibration_inputs": len(feeds), "error": candidates.get(k),
        "bf16_error": candidates[0],
        "bf16_time_share": share(ranked[k:]), "fp32_fallback": fallback, "declined": None,
        "kept_fp32": [{"node": n, "sensitivity": cost[n], "time_us": time_us[n], "why": why, "code": code.value}
                      for n, (why, code) in zip(kept, [(BUDGET_WHY, Reason.AUTO_BUDGET)] * budget_kept
                                                + [(fallback_why, Reason.AUTO_FALLBACK)] * (k - budget_kept))],
        "steps": [{"kept": n, "error": e} for n, e in sorted(candidates.items())],
        "chosen": "fp32" if ranked and k == len(ranked) else "bf16", "int8": int8}
