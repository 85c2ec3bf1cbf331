"""Planning a compiled model: ``plan_execution`` turns an optimised graph into its
``ExecutionPlan``; ``plan_and_bind`` plans and binds it into a ``CompiledModel``.

The memory plan (``plan_memory``: order, lifetimes, arena offsets; in ``tight`` mode the order
is the planner's, and the runtime generates code in that order), then, for more than one
stream, the stream plan on that order and the memory plan again with the stream hooks (a
buffer is reused only across an event or within a stream). The result is an
``ExecutionPlan`` (pure data, ``model.plan``), which the executor binds. The algorithms live in
``plan/``; this module only sequences them.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from ..config import Config
from ..ir import Graph
from ..plan.exec_plan import ExecutionPlan
from ..plan.memory import FAST_ALGORITHMS
from ..plan.memory_plan import PlanOptions, plan_memory
from ..report import CompileReport
from .model import CompiledModel, device_of


def has_symbolic_inputs(graph: Graph) -> bool:
    """A tensor input with a symbolic or unknown dim, and no sequence or optional input (whose
    runs take the shape-generic kernels): the model runs a symbolic plan."""
    if any("container" in v.meta for v in graph.inputs):
        return False
    return any(v.shape is None or not all(isinstance(d, int) for d in v.shape) for v in graph.inputs)


def plan_execution(graph: Graph, config: Config, report: CompileReport) -> ExecutionPlan:
    """The ``ExecutionPlan`` of an optimised ``graph`` under ``config`` (memory, then streams);
    ``report.memory`` and ``report.streams`` are set from it. A graph with symbolic input dims
    gets a symbolic plan: its order, and offsets per bucket of shapes at run time
    (``bucket_planner``)."""
    mplan = plan_memory(graph, config)
    if has_symbolic_inputs(graph) and device_of(config) == "cpu":
        report.memory = mplan.report
        streams = None
        if config.streams == "auto" or config.streams > 1:     # costs from the symbolic graph's static parts
            from ..plan.streams import plan_streams
            sp = plan_streams(graph, list(mplan.order), config.streams)
            streams = sp if sp.num_streams > 1 else None
            report.streams = sp
        return ExecutionPlan.for_symbolic([n.name for n in mplan.order], config.memory, streams)
    streams = None
    if config.streams == "auto" or config.streams > 1:
        from ..plan.streams import plan_streams
        from ..plan.stream_memory import stream_hooks
        cost = None
        if config.streams == "auto" and device_of(config) == "cpu":   # hybrid plans need measured costs
            from ..runtime.stream_calibrate import calibrate_costs
            cost = calibrate_costs(graph, ExecutionPlan.from_memory_plan(mplan, config.memory),
                                   config.threads or torch.get_num_threads())
        sp = plan_streams(graph, list(mplan.order), config.streams, cost)
        if sp.num_streams > 1:
            streams = sp
            if config.memory != "off":
                release_after, inplace_ok = stream_hooks(graph, mplan.order, sp)
                mplan = plan_memory(graph, config, PlanOptions(order=tuple(mplan.order), release_after=release_after,
                                                               inplace_ok=inplace_ok))
        if report.streams is None:
            report.streams = sp
    report.memory = mplan.report
    return ExecutionPlan.from_memory_plan(mplan, config.memory, streams)


def bucket_planner(graph: Graph, config: Config, plan: ExecutionPlan) -> Callable:
    """For a symbolic ``plan``: ``planner(sizes, inplace_ok) -> MemoryPlan``, the memory plan of
    one bucket of input shapes, in the plan's order (``sizes``: every activation's bytes at
    that bucket, None for those sized at run time; ``inplace_ok``: a veto on in-place pairs),
    with the fast offset algorithms (made while the model runs)."""
    by_name = {n.name: n for n in graph.nodes}
    order = tuple(by_name[name] for name in plan.order)
    algorithms = ("naive",) if config.memory == "off" else FAST_ALGORITHMS
    release_after = stream_ok = None
    if plan.streams is not None and config.memory != "off":   # a buffer reused across an event only
        from ..plan.stream_memory import stream_hooks
        release_after, stream_ok = stream_hooks(graph, list(order), plan.streams)

    def planner(sizes: dict, inplace_ok: Callable | None = None):
        both = inplace_ok if stream_ok is None else (
            stream_ok if inplace_ok is None else (lambda n, m: stream_ok(n, m) and inplace_ok(n, m)))
        return plan_memory(graph, config, PlanOptions(order=order, sizes=sizes, algorithms=algorithms,
                                                      inplace_ok=both, release_after=release_after))
    return planner


def plan_and_bind(graph: Graph, config: Config, report: CompileReport, shared_forms=None) -> CompiledModel:
    """An optimised graph through the planner and binding (``shared_forms``: packed weights
    shared with the model's other per-shape compiles)."""
    t2 = time.perf_counter()
    report.nodes_final = len(graph.nodes)
    report.op_histogram = graph.op_histogram()
    plan = plan_execution(graph, config, report)
    t3 = time.perf_counter()
    planner = bucket_planner(graph, config, plan) if plan.symbolic else None
    compiled = CompiledModel(graph, config, report, plan, shared_forms=shared_forms, planner=planner)
    report.timings = {**report.timings, "plan": t3 - t2, "bind": time.perf_counter() - t3}
    return compiled
