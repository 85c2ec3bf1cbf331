"""Per-kernel times of a compiled model's generated run, as a table and a Chrome trace.

``profile(model, feeds, runs) -> Profile`` runs ``model.run(feeds, hook=...)``: the generated
code calls the hook before (phase 0) and after (phase 1) the node at each index of
``model.plan.order``, on the thread (stream) that runs it, and the hook takes
``time.perf_counter_ns()`` stamps. The hooked run calls the same kernels as the plain run
(every node is its own call there too), so what is timed is the real run's kernels; the
unhooked run's median total is measured beside it (``Profile.plain_ms``): the difference is
the hook's own cost.
On CUDA the hook synchronises the device around every node, so each figure is the kernel's
own time (the streams then do not overlap in the trace).
Nodes that the plain run leaves to its once-per-input-shapes memo (``report.shape_kernels``,
``runtime/shape_memo.py``) run in the hooked code too: they are kept, as category
``shape``, apart from the ``kernel`` events, whose count equals ``report.kernel_count``.

``Profile.to_chrome_trace()`` is the ``chrome://tracing`` / Perfetto JSON of the median run:
one complete (``ph: "X"``) event per node, ``tid`` = its stream, named ``node (op)``, with
op, rule, stream and shapes in ``args``. ``Profile.to_text()`` is the terminal table: top
kernels and time by op type (per-node medians over the runs). Nothing here changes the model.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import UsageError
from ..report.printable import printable


@dataclass
class KernelTime:
    index: int              # position in plan.order
    name: str
    op: str                 # domain::op_type or op_type
    stream: int
    start_us: float         # in the median run, from the run's first kernel start
    dur_us: float           # in the median run
    median_us: float        # per-node median over all runs
    category: str = "kernel"   # "kernel" | "shape" (once per input shapes in the plain run)
    rule: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class Profile:
    model: str
    runs: int
    streams: int
    kernels: list[KernelTime]
    run_ms: list[float]             # hooked runs: first start -> last end
    plain_ms: float                 # median total of the unhooked run (model.run)
    kernel_count: int               # report.kernel_count
    threads: int = 1                # intra-op threads the runs ran at

    @property
    def kernel_events(self) -> list[KernelTime]:
        return [k for k in self.kernels if k.category == "kernel"]

    @property
    def hooked_ms(self) -> float:
        return statistics.median(self.run_ms) if self.run_ms else 0.0

    def by_op(self) -> list[tuple[str, int, float]]:
        """(op, count, total median µs), largest total first."""
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for k in self.kernels:
            total[k.op] += k.median_us
            count[k.op] += 1
        return sorted(((op, count[op], us) for op, us in total.items()), key=lambda t: -t[2])

    def top(self, n: int = 15) -> list[KernelTime]:
        return sorted(self.kernels, key=lambda k: -k.median_us)[:n]

    def to_chrome_trace(self) -> dict[str, Any]:
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": f"fusegraph: {self.model}"}}]
        for s in range(self.streams):
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stream {s}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": s, "args": {"sort_index": s}})
        for k in sorted(self.kernels, key=lambda k: k.start_us):
            events.append({"name": f"{k.name} ({k.op})", "cat": k.category, "ph": "X", "pid": 0, "tid": k.stream,
                           "ts": round(k.start_us, 3), "dur": round(k.dur_us, 3),
                           "args": {"op": k.op, "node": k.name, "index": k.index, "stream": k.stream,
                                    "rule": k.rule, "inputs": k.inputs, "outputs": k.outputs,
                                    "median_us": round(k.median_us, 3)}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"model": self.model, "runs": self.runs, "streams": self.streams,
                              "kernel_count": self.kernel_count, "threads": self.threads, "hooked_run_ms": self.hooked_ms,
                              "plain_run_ms": self.plain_ms,
                              "note": "per-kernel timing runs the plain run's kernels with a timestamp around each"}}

    def to_text(self, top: int = 15) -> str:
        total = sum(k.median_us for k in self.kernels) or 1.0
        shape = len(self.kernels) - len(self.kernel_events)
        lines = [f"{printable(self.model)}: {len(self.kernel_events)} kernels"
                 + (f" (+{shape} shape-only, once per input shapes in the plain run)" if shape else "")
                 + f", {self.streams} stream(s), {self.threads} thread(s), median of {self.runs} runs",
                 (f"run with the timing hook (the same kernels, a timestamp around each): {self.hooked_ms:.3f} ms; "
                  f"plain run (model.run): {self.plain_ms:.3f} ms"),
                 "", "top kernels (per-node median):",
                 f"  {'us':>10} {'%':>6}  {'stream':>6}  node (op)"]
        for k in self.top(top):
            lines.append(f"  {k.median_us:>10.1f} {100 * k.median_us / total:>5.1f}%  {k.stream:>6}  "
                         f"{printable(k.name)} ({printable(k.op)})")
        lines += ["", "time by op type:", f"  {'us':>10} {'%':>6}  {'count':>5}  op"]
        for op, n, us in self.by_op():
            lines.append(f"  {us:>10.1f} {100 * us / total:>5.1f}%  {n:>5}  {printable(op)}")
        return "\n".join(lines)


def _op(node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def _shape_only_names(model) -> set[str]:
    """Nodes the plain run computes once per input shapes (``report.shape_kernels`` of them)."""
    if not model.report.shape_kernels:
        return set()
    program = getattr(model._executor._runner, "program", None)
    if program is not None:              # a symbolic model: its frames compute them
        return {n.name for n in program.computed_nodes}
    from ..runtime.shape_memo import shape_only_calls
    binding = model._executor.binding    # read only: which calls the plain run memoises
    memo = shape_only_calls(model.graph, binding.calls)
    return {c.node.name for c in memo.calls} if memo else set()


def profile(model, feeds: Mapping[str, Any], runs: int = 10, warmup: int = 2) -> Profile:
    """Time every node of ``model``'s generated run over ``runs`` hooked runs (after ``warmup``
    plain and hooked runs), and the plain run's total over as many runs. A model with symbolic
    input dims is profiled in its compile at the feeds' shapes, which is what its runs execute."""
    if runs < 1:
        raise UsageError(f"profile: runs must be at least 1, got {runs}")
    model = model.runs_as(feeds)
    nodes = {n.name: n for n in model.graph.nodes}
    order = list(model.plan.order) if model.plan is not None else [n.name for n in model.graph.nodes]
    streams = getattr(model.plan, "streams", None) if model.plan is not None else None
    stream_of = streams.stream_of if streams is not None and streams.num_streams > 1 else {}
    n = len(order)
    start = [0] * n
    end = [0] * n
    seen = [False] * n
    observed: dict[int, list[str]] = {}

    from ..compiler.model import device_of
    sync = torch.cuda.synchronize if device_of(model.config) == "cuda" else None

    def hook(i, phase, outs):
        if sync is not None:        # CUDA launches are asynchronous: time the kernel, not its launch
            sync()
        if phase == 0:
            start[i] = time.perf_counter_ns()
        else:
            end[i] = time.perf_counter_ns()
            seen[i] = True

    def shapes_hook(i, phase, outs):    # warm-up only: the tensors' real shapes
        if phase == 1:
            observed[i] = [str(tuple(getattr(t, "shape", ()))) for t in outs]

    for _ in range(warmup):
        model.run(feeds)
    model.run(feeds, hook=shapes_hook)
    plain: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        model.run(feeds)
        plain.append((time.perf_counter_ns() - t0) / 1e6)
    samples: list[tuple[list[int], list[int]]] = []
    for _ in range(runs):
        seen[:] = [False] * n
        model.run(feeds, hook=hook)
        samples.append((list(start), list(end)))
    ran = [i for i in range(n) if seen[i]]
    totals = [(max(e[i] for i in ran) - min(s[i] for i in ran)) / 1e6 if ran else 0.0 for s, e in samples]
    median_run = sorted(range(runs), key=lambda r: totals[r])[runs // 2]
    s_med, e_med = samples[median_run]
    t_zero = min((s_med[i] for i in ran), default=0)
    shape_only = _shape_only_names(model)
    kernels = []
    for i in ran:
        node = nodes[order[i]]
        per_run = [(e[i] - s[i]) / 1e3 for s, e in samples]
        kernels.append(KernelTime(
            index=i, name=node.name, op=_op(node), stream=int(stream_of.get(node.name, 0)),
            start_us=(s_med[i] - t_zero) / 1e3, dur_us=(e_med[i] - s_med[i]) / 1e3,
            median_us=statistics.median(per_run), category="shape" if node.name in shape_only else "kernel",
            rule=str(node.meta.get("rule", "")),
            inputs=["_" if v is None else v.type_str() for v in node.inputs],
            outputs=observed.get(i) or [o.type_str() for o in node.outputs]))
    return Profile(model=model.name, runs=runs, streams=streams.num_streams if stream_of else 1,
                   kernels=kernels, run_ms=totals, plain_ms=statistics.median(plain),
                   kernel_count=model.report.kernel_count, threads=model.config.threads or torch.get_num_threads())
