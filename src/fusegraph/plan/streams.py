"""Stream planning: which stream runs each node, and which events order the streams.

``plan_streams(graph, order, n_streams, cost=None) -> StreamPlan`` (pure data):

1. the dependency DAG of ``order`` (a producer -> consumer edge per value a node reads from an
   earlier node; constants and graph inputs add none);
2. a cost per node (``cost.CostModel``: dispatch overhead + roofline work, with the CPU cores
   split across the streams), bottom levels and the critical path;
3. stream assignment by list scheduling onto ``n`` streams, keeping chains (a node whose only
   producer has it as only consumer) on their producer's stream. Two priorities are tried,
   critical-path-first (highest bottom level) and the planned order, each placing a node on
   the stream where it can start earliest (a cross-stream input costs ``sync_us``); the plan
   whose simulated makespan is smaller is kept;
4. each stream runs its nodes in ``order``'s order, so ``order`` is always a valid interleaving
   (no deadlock); a node waits on an event recorded after a producer on another stream only
   when its stream has not already synchronised, directly or transitively, with that producer
   or a later point of its stream (vector clocks; the result is a transitive reduction: no wait
   can be dropped without leaving a cross-stream edge unordered);
5. ``"auto"`` tries 1..k streams (k: the estimated parallelism, capped by the CPU cores or 4 on
   CUDA) and keeps more than one only when its estimate beats one stream by ``min_gain``.
   On CPU it also tries *hybrid* plans (``stream_hybrid.py``): a node runs either wide (alone,
   every core as intra-op threads) or narrow (``cores // n`` threads beside other streams);
   ``wide`` lists the wide nodes, and extra events keep each of them alone. With measured
   costs (``cost.MeasuredCosts``, from ``runtime/stream_calibrate.py``) this is what pays on
   a 2-core CPU: big sequential kernels keep both threads, small branch kernels overlap.

Empty streams are dropped, so ``num_streams`` may be below the number asked for.
Nothing here mutates the graph or runs a kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Graph
from ..report.streams import StreamEvent, StreamPlan
from .cost import CostModel, MeasuredCosts, fixed_costs
from .stream_dag import Dag, list_schedule, reduce_waits, simulate
from .stream_hybrid import exclusion_edges, hybrid_schedule, region_schedule

MAX_AUTO_CUDA = 4


@dataclass
class _Candidate:
    n: int
    stream: list[int]
    waits: list[list[int]]
    start: list[float]
    estimate: float
    cost: list[float]
    threads: int
    algorithm: str
    wide: list[bool] | None = None


def _costs(dag: Dag, cost, n: int) -> tuple[list[float], float, float, int]:
    """(costs, sync µs, serial µs per node, threads per stream) for ``n`` streams."""
    if isinstance(cost, MeasuredCosts):
        t = max(1, cost.cores // n)
        scale = cost.contention if n > 1 else 1.0
        return [cost.node_us_at(x, t) * scale for x in dag.nodes], cost.sync_us, 0.0, t
    if cost is None or isinstance(cost, CostModel):
        model = (cost or CostModel.for_device()).for_streams(n)
        return [model.node_us(x) for x in dag.nodes], model.sync_us, model.dispatch_us, model.threads
    return fixed_costs(cost, dag.nodes), 0.0, 0.0, 1


def _plan_n(dag: Dag, cost, n: int) -> _Candidate:
    costs, sync, serial, threads = _costs(dag, cost, n)
    if n == 1 or len(dag) <= 1:
        stream = [0] * len(dag)
        start = simulate(stream, [[] for _ in stream], costs, 1, 0.0)
        return _Candidate(1, stream, [[] for _ in stream], start, sum(costs), costs, threads, "trivial")
    best = None
    for priority in ("critical", "order"):
        stream = _compact(list_schedule(dag, costs, n, sync, priority))
        used = max(stream) + 1
        waits = reduce_waits(dag, stream, used)
        start = simulate(stream, waits, costs, used, sync)
        makespan = max((s + c for s, c in zip(start, costs)), default=0.0)
        estimate = max(makespan, serial * len(dag))   # dispatch is serial (GIL / one launcher)
        if best is None or estimate < best.estimate:
            best = _Candidate(used, stream, waits, start, estimate, costs, threads, f"list-{priority}")
    return best


def _plan_hybrid(dag: Dag, cost, n: int) -> _Candidate | None:
    """The hybrid plan on ``n`` CPU streams (see ``stream_hybrid.py``), or None when it is
    not one (every node wide, or a cost without per-thread figures)."""
    model = cost or CostModel.for_device()
    if not isinstance(model, (CostModel, MeasuredCosts)) or model.device != "cpu" or model.cores < n or n < 2:
        return None
    narrow, sync, serial, threads = _costs(dag, model, n)
    wide = [model.node_us_wide(x) if isinstance(model, MeasuredCosts) else model.node_us_at(x, model.cores)
            for x in dag.nodes]
    best = None
    for priority in ("regions", "critical", "order"):
        if priority == "regions":
            stream, is_wide = region_schedule(dag, narrow, wide, n, sync)
        else:
            stream, is_wide = hybrid_schedule(dag, narrow, wide, n, sync, priority)
        if all(is_wide):
            continue
        stream = _compact(stream)
        used = max(stream) + 1
        if used < 2:
            continue
        first = stream[is_wide.index(True)] if any(is_wide) else 0
        if first != 0:                      # wide nodes on stream 0 (the calling thread)
            stream = [0 if k == first else (first if k == 0 else k) for k in stream]
        costs = [w if f else c for w, c, f in zip(wide, narrow, is_wide)]
        extra = exclusion_edges(stream, is_wide, used)
        waits = reduce_waits(dag, stream, used, extra)
        start = simulate(stream, waits, costs, used, sync)
        estimate = max(max((s + c for s, c in zip(start, costs)), default=0.0), serial * len(dag))
        if best is None or estimate < best.estimate:
            best = _Candidate(used, stream, waits, start, estimate, costs, threads, f"hybrid-{priority}", is_wide)
    return best


def _compact(stream: list[int]) -> list[int]:
    """Renumber streams 0.. in order of first use (drops empty ones)."""
    remap: dict[int, int] = {}
    return [remap.setdefault(k, len(remap)) for k in stream]


def _auto_limit(dag: Dag, cost) -> int:
    costs, _, _, _ = _costs(dag, cost, 1)
    total, (cp, _) = sum(costs), dag.critical_path(costs)
    width = math.ceil(total / cp - 1e-9) if cp > 0 else 1
    if cost is None or isinstance(cost, (CostModel, MeasuredCosts)):
        model = cost or CostModel.for_device()
        cap = model.cores if model.device == "cpu" else MAX_AUTO_CUDA
    else:
        cap = MAX_AUTO_CUDA
    return max(1, min(width, cap, len(dag)))


def plan_streams(graph: Graph, order: list, n_streams: int | str, cost=None, *,
                 min_gain: float | None = None) -> StreamPlan:
    """Plan ``order`` (a topological order of ``graph``'s nodes) onto up to ``n_streams`` streams.

    ``cost``: None (``CostModel.for_device()``: this machine), a ``CostModel``, a callable
    ``node -> µs`` or a mapping ``name -> µs`` (fixed costs: no sync or dispatch model).
    ``"auto"`` keeps more than one stream only when its estimate beats one stream by
    ``min_gain`` (a fraction), so it is never worse than one stream by the model's estimate;
    by default 5 % with a static model, 2 % with measured costs (``MeasuredCosts``).
    """
    del graph  # the order carries the nodes; kept for the agreed signature
    if min_gain is None:
        min_gain = 0.02 if isinstance(cost, MeasuredCosts) else 0.05
    dag = Dag(order)
    if n_streams == "auto":
        candidates = {1: _plan_n(dag, cost, 1)}
        for n in range(2, _auto_limit(dag, cost) + 1):
            for c in (_plan_n(dag, cost, n), _plan_hybrid(dag, cost, n)):
                if c is not None and (c.n not in candidates or c.estimate < candidates[c.n].estimate):
                    candidates[c.n] = c
        base = candidates[1].estimate
        best = min(c.estimate for c in candidates.values())
        chosen = candidates[1]
        if best < base * (1.0 - min_gain):
            chosen = min((c for c in candidates.values() if c.estimate <= best * 1.02), key=lambda c: c.n)
        estimates = {n: c.estimate for n, c in candidates.items()}
    elif isinstance(n_streams, int) and not isinstance(n_streams, bool) and n_streams >= 1:
        chosen = _plan_n(dag, cost, n_streams)
        base = _plan_n(dag, cost, 1).estimate if chosen.n > 1 else chosen.estimate
        estimates = {1: base, chosen.n: chosen.estimate}
    else:
        raise ValueError(f"n_streams must be a positive integer or 'auto', got {n_streams!r}")
    return _to_plan(dag, chosen, n_streams, base, estimates, cost)


def _to_plan(dag: Dag, c: _Candidate, requested, sequential: float, estimates: dict,
             cost) -> StreamPlan:
    names = dag.names
    per_stream: list[list[str]] = [[] for _ in range(c.n)]
    for i, k in enumerate(c.stream):
        per_stream[k].append(names[i])
    producers = sorted({p for w in c.waits for p in w})
    event_of = {p: e for e, p in enumerate(producers)}
    events = [StreamEvent(e, names[p], c.stream[p]) for e, p in enumerate(producers)]
    total = sum(c.cost)
    cp, path = dag.critical_path(c.cost)
    device = cost.device if isinstance(cost, (CostModel, MeasuredCosts)) else (
        CostModel.for_device().device if cost is None else "fixed")
    return StreamPlan(
        num_streams=c.n, stream_of={names[i]: k for i, k in enumerate(c.stream)}, per_stream=per_stream,
        events=events, waits={names[i]: [event_of[p] for p in w] for i, w in enumerate(c.waits)},
        records={names[p]: e for p, e in event_of.items()}, critical_path=cp, total_work=total,
        estimated_parallelism=total / cp if cp > 0 else 1.0, critical_nodes=[names[i] for i in path],
        estimated_time=c.estimate, sequential_time=sequential, requested=requested, device=device,
        threads_per_stream=c.threads, algorithm=c.algorithm, candidates=dict(sorted(estimates.items())),
        op_of={names[i]: n.op_type for i, n in enumerate(dag.nodes)},
        cost={names[i]: x for i, x in enumerate(c.cost)}, start={names[i]: s for i, s in enumerate(c.start)},
        wide=[names[i] for i, w in enumerate(c.wide or ()) if w])
