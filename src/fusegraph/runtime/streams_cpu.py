"""Multi-stream CPU execution: one generated function per stream, each on its own thread.

``CpuStreamRunner`` turns a StreamPlan (``plan/streams.py``) into one module of generated code
(``codegen.FunctionSpec`` per stream): a stream's nodes in its order, a wait before a node for
each event the plan lists for it, a record after a node that records one. Values that cross
streams go through a per-run list ``E`` (stored right after they are made, loaded after the
wait that orders them); arena values need no passing, every stream names the same view.

Events are plain ``threading.Lock`` objects: unset = held; record = ``release()``; wait =
``acquire(); release()`` (no condition variable, no allocation). They are reset (re-acquired)
at the start of each run. Stream 0 runs on the calling thread, stream k > 0 on persistent
worker k (threads made at the first run, stopped by ``close()`` or when the runner is
collected). torch's intra-op thread count is per thread for its OpenMP pool: during a run
every stream thread uses ``max(1, threads // streams)``, and the caller's setting is restored
afterwards. A hybrid plan's *wide* nodes (``plan.wide``, all on stream 0) run with every
thread: the generated code sets the count before a node whose budget differs from the
previous one on its stream (``torch.set_num_threads`` is cheap), after its waits, and the
plan's events keep every other stream idle meanwhile. With wide nodes, each worker owns an
idle OpenMP team (``own_openmp_team``), which makes libgomp throttle its spin-waiting,
process-wide, while the workers live (other models in the process included: see
benchmarks/RESULTS_runtime.md); without it the calling thread's team spins for milliseconds
after each wide node on a core the other stream needs (inception_v2 measured slower:
benchmarks/RESULTS_runtime.md, "CPU streams").
A failing stream sets the abort flag and opens every event, so the other streams stop at
their next wait instead of blocking; the first real error is re-raised (a cancelled run's
``RunCancelled`` included: every stream reads the run's stop flag before each call). Every stream runs
the kernels one stream runs (the binding's).
This file plans nothing: streams, waits and records come from the plan.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

import torch

from ..errors import PlanError
from ..ir import Graph
from .bind import Binding
from .codegen import (FunctionSpec, GeneratedCode, Names, arena_globals, arena_names, control_globals,
                      generate_module)
from .threads import intra_op_threads


class _Aborted(Exception):
    """Raised inside a stream when another stream failed."""


class _Worker:
    """A persistent thread that runs one function per run, handed over through two locks."""

    def __init__(self, name: str, team: int = 0):
        self.team = team
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self.job = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        budget = None
        own_openmp_team(self.team)
        with torch.inference_mode():
            while True:
                self._go.acquire()
                job = self.job
                if job is None:
                    self._done.release()
                    return
                fn, env, threads, on_error = job
                self.job = None
                if threads != budget:
                    torch.set_num_threads(threads)
                    budget = threads
                try:
                    fn(env)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    self.error = exc
                    on_error()
                del fn, env, job, on_error   # hold nothing of the runner between runs
                self._done.release()

    def submit(self, fn: Callable, env: list, threads: int, on_error: Callable) -> None:
        self.error = None
        self.job = (fn, env, threads, on_error)
        self._go.release()

    def wait(self) -> BaseException | None:
        self._done.acquire()
        error, self.error = self.error, None
        return error

    def stop(self) -> None:
        self.job = None
        self._go.release()


def own_openmp_team(threads: int) -> None:
    """Make this thread the master of an (idle) OpenMP team of ``threads`` threads.

    libgomp spin-waits ~300,000 iterations (milliseconds) in an idle team thread after every
    parallel region, unless it manages more threads than there are CPUs; then it spins 100
    (GOMP_SPINCOUNT in the libgomp manual). A stream worker's team puts the process in that
    regime while the workers live: the calling thread's team no longer burns a core that the
    other stream needs after a wide node, and a team thread waiting at a barrier for a
    descheduled partner sleeps instead of spinning. The team stays idle: kernels on this
    thread run at the budget set per run."""
    if threads < 2:
        return
    with intra_op_threads(threads):
        torch.ones(1 << 17).add_(1.0)       # above ATen's grain size: one parallel region


def _stop_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()


def build_stream_specs(graph: Graph, binding: Binding, plan, names, *, hook: bool, wait_lines, record_lines,
                       prefix: str = "stream", skip: frozenset = frozenset(), direct: bool = True):
    """FunctionSpecs (one per stream) and the E layout: (specs, n_slots, template, output_slots);
    with ``direct``, kernels that offer it are called directly (``direct.py``).

    ``wait_lines(event_ids)`` / ``record_lines(event_id)`` give the source lines of a wait
    before a call and a record after it (CPU locks here, CUDA events in ``streams_cuda``).
    ``skip``: nodes that run before the streams (a frame's shape-only work): left out; a wait
    on an event one of them records is dropped (its value is there before any stream starts)."""
    all_calls = {c.node.name: c for c in binding.calls}
    if set(all_calls) != set(plan.stream_of):
        raise PlanError(f"{graph.name}: the stream plan does not cover exactly the graph's nodes")
    calls = {n: c for n, c in all_calls.items() if n not in skip}
    done_before = {e.id for e in plan.events if e.producer in skip}
    stream_of = plan.stream_of
    slot: dict[int, int] = {}
    for i, v in enumerate(graph.inputs):
        slot[id(v)] = i
    template: list = [None] * len(graph.inputs)

    def slot_of(v) -> int:
        if id(v) not in slot:
            slot[id(v)] = len(template)
            template.append(v.const if v.is_const else None)
        return slot[id(v)]

    made_on = {id(o): stream_of[c.node.name] for c in binding.calls for o in c.node.outputs}
    outputs = {id(v) for v in graph.outputs}
    read_on: dict[int, set[int]] = {}
    for c in calls.values():
        for v in c.node.inputs:
            if v is not None:
                read_on.setdefault(id(v), set()).add(stream_of[c.node.name])
    specs = []
    for k in range(plan.num_streams):
        spec = FunctionSpec(f"{prefix}{k}", [calls[n] for n in plan.per_stream[k] if n in calls], params=["E"],
                            hook=hook, direct=direct)
        for pos, call in enumerate(spec.calls):
            node = call.node
            waits = [e for e in plan.waits.get(node.name, []) if e not in done_before]
            if waits:
                spec.before[pos] = wait_lines(waits)
            if node.name in plan.records:
                spec.after[pos] = record_lines(plan.records[node.name])
            for v in node.inputs:
                if v is not None and names.is_local(v) and made_on.get(id(v)) != k:
                    spec.imports[id(v)] = slot_of(v)
            for o in node.outputs:
                if id(o) in outputs or (names.is_local(o) and read_on.get(id(o), set()) - {k}):
                    spec.exports[id(o)] = slot_of(o)
        specs.append(spec)
    importers: dict[int, int] = {}
    for spec in specs:
        for key in spec.imports:
            importers[key] = importers.get(key, 0) + 1
    inputs = {id(v) for v in graph.inputs}
    for spec in specs:
        spec.consume = {key for key in spec.imports if importers[key] == 1 and key not in outputs and key not in inputs}
    out_slots = [slot_of(v) for v in graph.outputs]
    return specs, template, out_slots


def _thread_switches(spec: FunctionSpec, wide: frozenset) -> None:
    """Hybrid plans: set the intra-op thread count before a node whose budget differs from
    the previous node's on this stream (after its waits: a wide node's waits are what keep
    the other streams idle). Each stream starts a run at the narrow budget."""
    current = False
    for pos, call in enumerate(spec.calls):
        is_wide = call.node.name in wide
        if is_wide != current:
            spec.before.setdefault(pos, []).append(f"_snt(_tb[{0 if is_wide else 1}])")
            current = is_wide


class CpuStreamRunner:
    def __init__(self, graph: Graph, binding: Binding, plan, filename: str, threads: int | None = None,
                 direct_calls: bool = True, frames=None, memo=None, frame_values: list | None = None,
                 control=None):
        """``frames`` (a ``frames.FrameBuilder``), ``memo`` and ``frame_values``: a model with
        symbolic input dims: the frame of a run's input shapes is taken before the streams
        start, its computed values (``memo.held``, made by the frame builder) and arena views
        (``frame_values``) become the module's globals for the run, and the computed nodes run
        in no stream. ``control``: the run's stop flag, read
        before each call on every stream."""
        self.graph, self.binding, self.plan, self.filename = graph, binding, plan, filename
        self.direct_calls = direct_calls and frames is None     # a frame's views change per shape
        self.frames, self.memo, self.frame_values = frames, memo, list(frame_values or ())
        self._frame = None
        self.control = control
        self.n = plan.num_streams
        self.threads = threads
        self.events = {e.id: threading.Lock() for e in plan.events}
        wide = getattr(plan, "wide", None) or ()
        if not isinstance(wide, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in wide):
            raise PlanError(f"{graph.name}: the stream plan's wide nodes must be a list of node names")
        self.wide = frozenset(wide)
        self._budgets = [1, 1]                 # [wide, narrow] intra-op threads of this run
        self._abort_flag = [False]
        self.code = self._generate(None)
        self.codes = [self.code]
        self._workers: list[_Worker] = []
        self._finalizer = None

    def _generate(self, hook: Callable | None) -> GeneratedCode:
        skip: frozenset = frozenset()
        if self.frames is not None:
            names = Names(self.binding.dense)
            held = (self.memo.held if self.memo else []) + self.frame_values
            self._frame_names = [names.set_global(v, None) for v in held]     # set per run from the frame
            skip = frozenset([c.node.name for c in self.memo.calls] + [n.name for n in self.memo.computed]) \
                if self.memo else frozenset()
        else:
            names = arena_names(self.binding)
        for eid, lock in self.events.items():
            names.env[f"e{eid}"] = lock

        def wait_lines(ids):
            return [f"e{i}.acquire(); e{i}.release()" for i in ids] + ["if _ab[0]: raise _Aborted()"]

        def record_lines(i):
            return [f"e{i}.release()"]

        specs, self.template, self.out_slots = build_stream_specs(
            self.graph, self.binding, self.plan, names, hook=hook is not None,
            wait_lines=wait_lines, record_lines=record_lines, skip=skip, direct=self.direct_calls)
        for spec in specs:
            spec.checks = self.control is not None
        if self.wide:
            for spec in specs:
                _thread_switches(spec, self.wide)
        extra = arena_globals(self.binding)
        extra.update({"_ab": self._abort_flag, "_Aborted": _Aborted, "_snt": torch.set_num_threads,
                      "_tb": self._budgets})
        if self.control is not None:
            extra.update(control_globals(self.control))
        if hook is not None:
            extra["_hook"] = hook
        filename = self.filename + (":hook" if hook is not None else "")
        code = generate_module(specs, names, filename, extra)
        code.function = code.functions[specs[0].name]
        if self.frames is not None:
            self.frames.envs = [code.env] if hook is None else [self.code.env, code.env]
            self.frames.arena_moved()
            self._frame = None
        return code

    def _start_workers(self) -> None:
        team = max(2, self.threads or torch.get_num_threads()) if self.wide else 0   # hybrid plans only
        self._workers = [_Worker(f"fusegraph-stream-{k}", team) for k in range(1, self.n)]
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def _abort(self) -> None:
        self._abort_flag[0] = True
        for lock in self.events.values():
            if lock.locked():
                try:
                    lock.release()
                except RuntimeError:   # another thread released it meanwhile
                    pass

    def _reset(self) -> None:
        self._abort_flag[0] = False
        for lock in self.events.values():
            lock.acquire(blocking=False)

    def __call__(self, tensors: list[torch.Tensor], hook: Callable | None = None) -> tuple:
        code = self.code
        if hook is not None:
            code = self._generate(hook)
            self.codes = [self.code, code]
        fns = [code.functions[f"stream{k}"] for k in range(self.n)]
        if not self._workers:
            self._start_workers()
        if self.frames is not None:
            frame = self.frames.frames.get(tuple(t.shape for t in tensors))
            if frame is None:
                frame = self.frames(*tensors)
            if frame is not self._frame or code is not self.code:
                code.env.update(zip(self._frame_names, frame))
                self._frame = frame if code is self.code else None
        env = list(self.template)
        env[:len(tensors)] = tensors
        self._reset()
        before = torch.get_num_threads()
        budget = max(1, (self.threads or before) // self.n)
        self._budgets[:] = [self.threads or before, budget]
        with intra_op_threads(budget):
            for w, fn in zip(self._workers, fns[1:]):
                w.submit(fn, env, budget, self._abort)
            errors: list[BaseException | None] = []
            try:
                fns[0](env)
                errors.append(None)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                self._abort()
            errors += [w.wait() for w in self._workers]
        real = [e for e in errors if e is not None and not isinstance(e, _Aborted)]
        if real:
            raise real[0]
        if any(errors):
            raise RuntimeError("a stream was aborted without an error")
        return tuple(env[s] for s in self.out_slots)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._workers = []
