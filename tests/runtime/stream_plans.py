"""Hand-made stream plans for runtime tests (the agreed StreamPlan interface, duck-typed), and a
helper that rebinds a compiled model with a given memory mode and stream plan.

``toy_stream_plan`` puts every node on a stream (random, or following chains), then records
an event after every producer read on another stream and makes the consumer wait on it; it
prunes nothing, which the runtime must accept as well.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import fusegraph as fg
from fusegraph.compiler.driver import CompiledModel
from fusegraph.plan.exec_plan import ExecutionPlan
from fusegraph.plan.memory_plan import PlanOptions, plan_memory
from fusegraph.plan.stream_memory import stream_hooks


@dataclass
class ToyEvent:
    id: int
    producer: str
    stream: int


@dataclass
class ToyStreamPlan:
    num_streams: int
    stream_of: dict
    per_stream: list
    events: list
    waits: dict
    records: dict
    critical_path: float = 0.0
    total_work: float = 0.0
    estimated_parallelism: float = 1.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"num_streams": self.num_streams, "stream_of": self.stream_of, "per_stream": self.per_stream,
                "events": [vars(e) for e in self.events], "waits": self.waits, "records": self.records}


def toy_stream_plan(order, n: int, seed: int = 0, chains: bool = True) -> ToyStreamPlan:
    rng = random.Random(seed)
    stream_of: dict[str, int] = {}
    for node in order:
        producers = [v.producer for v in node.inputs if v is not None and v.producer is not None]
        if chains and len(producers) == 1 and len(producers[0].outputs[0].users) == 1 and rng.random() < 0.7:
            stream_of[node.name] = stream_of[producers[0].name]
        else:
            stream_of[node.name] = rng.randrange(n)
    per_stream = [[nd.name for nd in order if stream_of[nd.name] == k] for k in range(n)]
    events, waits, records = [], {}, {}
    for node in order:
        for v in node.inputs:
            p = None if v is None else v.producer
            if p is None or p.name not in stream_of or stream_of[p.name] == stream_of[node.name]:
                continue
            if p.name not in records:
                records[p.name] = len(events)
                events.append(ToyEvent(len(events), p.name, stream_of[p.name]))
            ids = waits.setdefault(node.name, [])
            if records[p.name] not in ids:
                ids.append(records[p.name])
    return ToyStreamPlan(n, stream_of, per_stream, events, waits, records)


def rebind(model: CompiledModel, memory: str = "balanced", streams: int = 1, seed: int = 0,
           threads: int | None = None, planner: str = "toy") -> CompiledModel:
    """The same optimised graph, planned with ``memory`` and ``streams`` streams: a toy plan,
    or with ``planner="real"`` what ``compile`` plans (``plan/streams.py``), without re-running
    the passes."""
    graph = model.graph
    config = model.config.replace(memory=memory, threads=threads)
    if planner == "real":
        from fusegraph.compiler.planning import plan_execution
        config = config.replace(streams=streams)
        report = fg.report.CompileReport(model=model.name)
        return CompiledModel(graph, config, report, plan_execution(graph, config, report))
    mplan = plan_memory(graph, config)
    sp = None
    if streams > 1:
        sp = toy_stream_plan(mplan.order, streams, seed)
        if memory != "off":
            release_after, inplace_ok = stream_hooks(graph, mplan.order, sp)
            mplan = plan_memory(graph, config, PlanOptions(order=tuple(mplan.order), release_after=release_after,
                                                           inplace_ok=inplace_ok))
    report = fg.report.CompileReport(model=model.name)
    report.memory = mplan.report
    return CompiledModel(graph, config, report, ExecutionPlan.from_memory_plan(mplan, memory, sp))
