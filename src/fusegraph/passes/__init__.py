"""Graph optimisation passes (see passes/manager.py and passes/pipeline.py).

``optimize(graph, config, report)`` is what ``compiler/driver.py`` calls after import and shape
inference: it runs the pipeline named by ``config.level`` minus ``config.disabled_passes``,
fills ``report.passes`` (one PassStat per pass run), ``report.unfolded`` (what constant
folding declined, and why) and ``report.fusions`` (operator replacements applied or
declined) and ``report.precision`` (the precision pass's per-node dtypes, when reduced
precision is asked for), verifies the graph as it comes in and after the pipeline (after
every pass when ``config.verify_each`` is set; the seconds it took add up in
``report.timings["verify"]``), and writes the IR after each pass when the environment variable
``FUSEGRAPH_DUMP`` names a folder.
"""
from __future__ import annotations

import os

from .fold import FoldLog
from .manager import FixedPoint, Pass, PassManager, PassOptions, PassResult
from .pipeline import PIPELINES, build_pipeline

__all__ = ["optimize", "options_from_config", "FixedPoint", "Pass", "PassManager", "PassOptions",
           "PassResult", "PIPELINES", "build_pipeline"]


def options_from_config(config) -> PassOptions:
    """Under ``precision="int8"`` the pipeline sees float32 and no ``op_precision``: the
    quantisation was written into the graph before it (``compiler/int8_ptq.py``), and its
    int8 passes run at every precision."""
    int8 = config.precision == "int8"
    return PassOptions(fold_size_limit=config.fold_size_limit,
                       fast_math=config.fast_math,
                       disabled=frozenset(config.disabled_passes),
                       aggressive_fusion=bool(getattr(config, "aggressive_fusion", False)),
                       fold_broadcast_limit=config.fold_broadcast_limit,
                       precision="bf16" if config.precision == "auto" else "fp32" if int8 else config.precision,
                       op_precision=() if int8 else tuple(config.op_precision))


def optimize(graph, config, report, options: PassOptions | None = None, on_pass=None) -> None:
    """Run the pipeline for ``config.level`` on ``graph`` in place, recording into ``report``
    (``on_pass``: the manager's debugging hook, see ``PassManager``)."""
    from ..ops import infer_node
    from ..report.compile_report import FusionRecord
    from .precision import precision_summary

    options = options or options_from_config(config)
    graph.meta.setdefault("output_names", [v.name for v in graph.outputs])
    wanted = set(getattr(config, "external_tensors", ()))
    # tensors a memory constraint names must survive too (fusion would otherwise absorb them)
    wanted.update(name for name, *_ in getattr(config, "tensor_lifetimes", ()))
    wanted.update(name for group in getattr(config, "reuse_groups", ()) for name in group)
    wanted.update(getattr(config, "exclusive_tensors", ()))
    for v in graph.values() if wanted else ():
        if v.name in wanted:
            v.flags.add("external")   # no pass may fold, merge or fuse it away
    fold_log, rewrite_log, precision_log = FoldLog(), [], []
    steps = build_pipeline(config.level, options, fold_log, rewrite_log, precision_log)
    manager = PassManager(steps, verify_each=config.verify_each, infer=infer_node,
                          dump_dir=os.environ.get("FUSEGRAPH_DUMP") or None, on_pass=on_pass)
    report.passes.extend(manager.run(graph))
    report.timings["verify"] = report.timings.get("verify", 0.0) + manager.verify_seconds
    report.unfolded.extend(fold_log.entries(graph))
    if options.precision != "fp32" or options.op_precision:
        report.precision = precision_summary(graph, options, precision_log)
    alive = {n.name for n in graph.nodes}
    for rec in rewrite_log:
        if rec["applied"] or rec.get("final") or all(n in alive for n in rec["nodes"]):
            report.fusions.append(FusionRecord(rec["rule"], rec["applied"], rec["nodes"], rec["reason"]))
