"""Timed calibration for ``streams="auto"`` on CPU: every node's time at one intra-op thread
and at all of them, measured on this machine, for the stream planner's hybrid plans.

``calibrate_costs(graph, plan, threads)`` binds the one-stream plan, runs it on synthetic inputs
(normal floats, zero integers, false booleans) with a timing hook around every kernel, at one
thread, at ``threads`` threads, and at ``threads`` threads while another thread owns an OpenMP
team (the regime of a hybrid plan's wide nodes, see ``streams_cpu.own_openmp_team``), and keeps
each node's fastest time per regime (the least disturbed by other processes; ``repeats`` runs
each: seconds on the light models at batch 1, benchmarks/RESULTS_runtime.md, "CPU streams").
Several-thread times are capped by a scaling model of the one-thread time (``MeasuredCosts``),
so a calibration on a loaded machine does not plan for the load. It returns a
``plan.cost.MeasuredCosts``, or None when it cannot measure (symbolic input shapes, one thread,
a kernel that fails on synthetic data): the planner then uses its static model.

The result only chooses the plan; it never changes what a kernel computes. The thread
setting of the calling thread is restored; nothing here is called at run time.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import torch

from ..ir import Graph
from ..plan.cost import CostModel, MeasuredCosts
from .threads import intra_op_threads

SYNC_US = 20.0          # a cross-stream handoff: lock release, thread wake-up, GIL
CONTENTION = 1.0        # one-thread kernels side by side ran at about their solo speed
# These constants were set on this 2-core VM so that the estimates stay below the measured
# gains of hybrid plans (inception_v1/v2: benchmarks/RESULTS_runtime.md, "CPU streams").
# Thread scaling of an undisturbed kernel (``CostModel.scaled_us``), fitted on this 2-core VM's
# quiet runs of the inception models: long convolutions gain most from a second thread, short
# kernels least (the fit: benchmarks/RESULTS.md, "Figures moved out of docstrings"). It caps
# the measured several-thread times (see ``MeasuredCosts``).
EFFICIENCY, GRAIN_US = 0.95, 250.0
WAKE_US = 15.0          # waking a sleeping OpenMP team thread, added to a capped wide node


def _synthetic_inputs(graph: Graph) -> list[torch.Tensor] | None:
    gen = torch.Generator().manual_seed(0)
    out = []
    for v in graph.inputs:
        shape = tuple(v.shape) if v.shape is not None else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        try:
            dtype = v.dtype.to_torch()
        except (TypeError, AttributeError):
            return None
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            out.append(torch.zeros(shape, dtype=dtype))
    return out


class TeamHolder:
    """A thread that owns an idle OpenMP team while it lives (``streams_cpu.own_openmp_team``):
    what the stream workers do, so wide nodes are measured in the regime they run in."""

    def __init__(self, threads: int):
        from .streams_cpu import own_openmp_team
        self._stop = threading.Event()
        ready = threading.Event()

        def hold():
            own_openmp_team(threads)
            ready.set()
            self._stop.wait()
        self.thread = threading.Thread(target=hold, name="fusegraph-calibrate-team", daemon=True)
        self.thread.start()
        ready.wait()

    def close(self) -> None:
        self._stop.set()
        self.thread.join()


def calibrate_costs(graph: Graph, plan, threads: int, repeats: int = 4) -> MeasuredCosts | None:
    """Per-node µs at 1 and ``threads`` intra-op threads, and at ``threads`` with the stream
    workers' OpenMP regime (see the module doc)."""
    if threads < 2:
        return None
    tensors = _synthetic_inputs(graph)
    if tensors is None:
        return None
    from .executor import Executor
    order = list(plan.order)
    executor = Executor(graph, graph.name, plan, device="cpu", threads=threads)
    regimes = [(1, False), (threads, False), (threads, True)]
    best = {r: [float("inf")] * len(order) for r in regimes}
    started = [0.0] * len(order)
    table: list[list[float]] = [best[regimes[0]]]

    def hook(i, phase, outs):
        if phase == 0:
            started[i] = time.perf_counter()
        else:
            dt = (time.perf_counter() - started[i]) * 1e6
            row = table[0]
            if dt < row[i]:
                row[i] = dt

    holder = None
    try:
        for t, throttled in regimes:
            if throttled and holder is None:
                holder = TeamHolder(threads)
            with intra_op_threads(t):
                executor.run_tensors(tensors)       # warm-up: oneDNN builds primitives per thread count
                table[0] = best[(t, throttled)]
                for _ in range(repeats):
                    executor.run_tensors(tensors, hook)
    except Exception:  # noqa: BLE001 - a model that cannot run on synthetic data is planned statically
        return None
    finally:
        if holder is not None:
            holder.close()
        executor.close()

    def named(row):
        return {name: row[i] for i, name in enumerate(order) if row[i] != float("inf")}
    scaling = dataclasses.replace(CostModel.for_device("cpu", threads), efficiency=EFFICIENCY, grain_us=GRAIN_US)
    return MeasuredCosts(us={1: named(best[regimes[0]]), threads: named(best[regimes[1]])}, cores=threads,
                         sync_us=SYNC_US, contention=CONTENTION, fallback=scaling,
                         wide_us=named(best[regimes[2]]), wake_us=WAKE_US)
