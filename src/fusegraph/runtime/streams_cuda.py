"""CUDA execution: torch streams and events, inputs copied on their own stream, optional
capture of the whole run as one CUDA graph.

One thread issues every kernel (CUDA streams give the concurrency): the generated ``run``
function walks a single order that respects each stream's order and every event (the plan's
order when it is consistent, see ``HappensBefore.issue_order``), switching the current stream
with ``torch.cuda.set_stream`` when the node's stream changes. Before a node: ``S.wait_event``
for each event the plan lists, and, before the first node of a stream reading a graph input,
a wait on that input's copy event. After a node: ``event.record(S)`` where the plan records;
a kernel-allocated tensor read on another stream gets ``record_stream`` so the caching
allocator does not reuse its memory under a pending read. The function forks every stream
from the caller's stream at its start and joins them back at its end.

Inputs: each feed is staged in a pinned host buffer and copied to a persistent device buffer
with ``non_blocking=True`` on a separate copy stream, all copies issued before the first
kernel, each with its own event, so a stream waits only for the inputs it reads.
``cuda_graph=True``: the first run warms up, then captures ``run`` into a ``torch.cuda.CUDAGraph``
(the arena, input buffers and weights have fixed addresses); later runs copy the feeds into
the input buffers and replay. A run that cannot be captured (a kernel syncs with the host)
falls back to eager issue with a ``RuntimeWarning``, and ``graph_error`` says why; the
capture ends on the stream it began on, and the caller's current stream is restored, even
when a run fails midway. ``benchmarks/gpu_check.py`` and ``tests/runtime/test_cuda_graphs.py``
check it where a GPU is lent (CI has none).
"""
from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Callable

import torch

from ..ir import Graph
from .bind import Binding
from .codegen import (FunctionSpec, GeneratedCode, arena_globals, arena_names, control_globals,
                      generate_module)


def _trivial_plan(binding: Binding):
    names = [c.node.name for c in binding.calls]
    return SimpleNamespace(num_streams=1, stream_of={n: 0 for n in names}, per_stream=[names], events=[],
                           waits={}, records={})


class CudaRunner:
    def __init__(self, graph: Graph, binding: Binding, plan, filename: str, cuda_graph: bool = False,
                 control=None):
        self.graph, self.binding, self.filename = graph, binding, filename
        self.control = control          # the run's stop flag, read before each issue (not in a capture)
        self.plan = plan if plan is not None else _trivial_plan(binding)
        self.device = binding.arena.tensor.device if binding.arena is not None else torch.device("cuda")
        n = self.plan.num_streams
        self.streams = [torch.cuda.Stream(self.device) for _ in range(n)]
        self.copy_stream = torch.cuda.Stream(self.device)
        self.events = {e.id: torch.cuda.Event() for e in self.plan.events}
        self.input_events = [torch.cuda.Event() for _ in graph.inputs]
        self.fork_event = torch.cuda.Event()
        self._staged: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # input -> (pinned, device)
        self.use_graph = cuda_graph
        self.graph_error: str | None = None
        self._cuda_graph = None
        self._graph_outs = None
        self.code = self._generate(None)
        self.codes = [self.code]

    # ------------------------------------------------------------------ code generation
    def _issue_order(self):
        from ..plan.stream_memory import HappensBefore
        order = [c.node for c in self.binding.calls]
        if self.plan.num_streams == 1:
            return self.binding.calls
        by_name = {c.node.name: c for c in self.binding.calls}
        return [by_name[n.name] for n in HappensBefore(order, self.plan).issue_order()]

    def _generate(self, hook: Callable | None, input_waits: bool = True) -> GeneratedCode:
        plan = self.plan
        names = arena_names(self.binding)
        env = names.env
        for k, s in enumerate(self.streams):
            env[f"S{k}"] = s
        for eid, ev in self.events.items():
            env[f"EV{eid}"] = ev
        for i, ev in enumerate(self.input_events):
            env[f"IN{i}"] = ev
        calls = self._issue_order()
        input_index = {id(v): i for i, v in enumerate(self.graph.inputs)}
        read_on: dict[int, set[int]] = {}
        for c in calls:
            for v in c.node.inputs:
                if v is not None:
                    read_on.setdefault(id(v), set()).add(plan.stream_of[c.node.name])
        params = [names(v) for v in self.graph.inputs]
        checks = self.control is not None and input_waits
        spec = FunctionSpec("run", calls, params=params, param_values=list(self.graph.inputs),
                            returns=list(self.graph.outputs), hook=hook is not None, checks=checks)
        spec.prologue = ["_orig = _current()", "_FORK.record(_orig)"] + \
                        [f"S{k}.wait_event(_FORK)" for k in range(plan.num_streams)]
        current = None
        input_ready: set[tuple[int, int]] = set()
        for pos, call in enumerate(calls):
            node = call.node
            k = plan.stream_of[node.name]
            before = []
            if k != current:
                before.append(f"_set_stream(S{k})")
                current = k
            before += [f"S{k}.wait_event(EV{e})" for e in plan.waits.get(node.name, [])]
            for v in node.inputs:
                i = input_index.get(id(v)) if v is not None else None
                if input_waits and i is not None and (i, k) not in input_ready:
                    input_ready.add((i, k))
                    before.append(f"S{k}.wait_event(IN{i})")
            spec.before[pos] = before
            after = []
            for o in node.outputs:
                if names.is_local(o):
                    after += [f"{names(o)}.record_stream(S{j})" for j in sorted(read_on.get(id(o), set()) - {k})]
            if node.name in plan.records:
                after.append(f"EV{plan.records[node.name]}.record(S{k})")
            spec.after[pos] = after
        spec.epilogue = ["_set_stream(_orig)"] + [f"_orig.wait_stream(S{k})" for k in range(plan.num_streams)]
        extra = arena_globals(self.binding)
        extra.update({"_current": torch.cuda.current_stream, "_set_stream": torch.cuda.set_stream,
                      "_FORK": self.fork_event})
        if checks:
            extra.update(control_globals(self.control))
        if hook is not None:
            extra["_hook"] = hook
        suffix = ":hook" if hook else ("" if input_waits else ":graph")
        return generate_module([spec], names, self.filename + suffix, extra)

    # ------------------------------------------------------------------ inputs
    def _stage(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Device copies of the feeds, issued on the copy stream, each with its event."""
        out = []
        current = torch.cuda.current_stream(self.device)
        self.copy_stream.wait_stream(current)   # the previous run's readers are done with the buffers
        for i, t in enumerate(tensors):
            if t.is_cuda:
                self.input_events[i].record(current)
                out.append(t)
                continue
            pinned, dev = self._staged.get(i, (None, None))
            if pinned is None or pinned.shape != t.shape or pinned.dtype != t.dtype:
                pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                dev = torch.empty(t.shape, dtype=t.dtype, device=self.device)
                self._staged[i] = (pinned, dev)
                self._cuda_graph = None     # a captured graph reads the old buffers: capture again
            pinned.copy_(t)
            with torch.cuda.stream(self.copy_stream):
                dev.copy_(pinned, non_blocking=True)
                self.input_events[i].record(self.copy_stream)
            out.append(dev)
        return out

    # ------------------------------------------------------------------ running
    def __call__(self, tensors: list[torch.Tensor], hook: Callable | None = None) -> tuple:
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream(self.device)
            try:
                staged = self._stage(tensors)
                if hook is not None:
                    code = self._generate(hook)
                    self.codes = [self.code, code]
                    return code.function(*staged)
                if self.use_graph and self.graph_error is None:
                    return self._replay(staged)
                return self.code.function(*staged)
            finally:
                torch.cuda.set_stream(caller)   # a run that failed midway leaves one of its streams current

    def _replay(self, staged: list[torch.Tensor]) -> tuple:
        if self._cuda_graph is None:
            try:
                self._capture(staged)
            except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager
                self.graph_error = f"{type(exc).__name__}: {exc}"
                self._cuda_graph = None
                warnings.warn(f"{self.filename}: cuda_graph: the run could not be captured "
                              f"({self.graph_error.splitlines()[0][:200]}); it runs eagerly", RuntimeWarning,
                              stacklevel=4)
                torch.cuda.synchronize(self.device)
                return self.code.function(*staged)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.copy_stream)
        self._cuda_graph.replay()
        return self._graph_outs

    def _capture(self, staged: list[torch.Tensor]) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        side.wait_stream(self.copy_stream)
        with torch.cuda.stream(side):
            for _ in range(2):
                self.code.function(*staged)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        # inside a capture no stream may wait on an event recorded outside it: this variant has no
        # input waits (the replay stream waits for the copy stream, and every stream forks from it)
        code = self._generate(None, input_waits=False)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            capturing = torch.cuda.current_stream(self.device)
            try:
                outs = code.function(*staged)
            finally:                            # the capture ends on the stream it began on, failed or not
                torch.cuda.set_stream(capturing)
        self._cuda_graph, self._graph_outs = g, outs
        self.codes = [self.code, code]

    def close(self) -> None:
        self._cuda_graph = None
