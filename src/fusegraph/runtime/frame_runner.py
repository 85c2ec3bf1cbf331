"""``FrameRunner``: how a model with symbolic input dims runs, on one stream: one binding and
one generated function for every input shape.

At bind time it finds the run's shape-only work (``shape_memo.py``: done once per input
shape), the shape program of every other value (``shape_program.py``), and which calls write
into the arena (``bind.frame_outputs``: the outputs whose shapes are known before the run and
that are not views), and generates the run function (``codegen.generate_frame_run_function``)
whose first lines take the frame of the inputs' shapes (``frames.py``: made on a miss, kept
after). The first run also probes the shape program at its (valid) shapes: a node whose
kernel turns out to need data to know its output shape becomes dynamic (its kernel
allocates), and the function is generated again, once. Outputs are handed out by the
executor as from any run (copied out of the arena). ``with_kernels`` gives the same runner
with some calls running other kernels (made for another thread count) and its own code,
sharing the frames (one arena, one set of plans).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable

from ..ir import Graph, Value
from ..ops.registry import view_input
from .bind import Binding, frame_outputs, with_kernels
from .codegen import generate_frame_run_function
from .frames import FrameBuilder
from .shape_memo import shape_only_calls
from .shape_program import ShapeProgram


class FrameRunner:
    def __init__(self, graph: Graph, binding: Binding, planner: Callable, filename: str, name: str,
                 device, declared: dict | None = None, replaced: dict[int, Callable] | None = None,
                 streams=None, threads: int | None = None):
        """``replaced``: id(node) -> a kernel that takes that node's place in this runner's code
        (it returns its result and writes no frame view: ``variant``); ``streams``: a stream
        plan of more than one stream (``streams_cpu.CpuStreamRunner`` runs it, on frames)."""
        self._args = (graph, planner, filename, name, device, declared, streams, threads)
        self.streams, self.threads = streams, threads
        self._stream_runner = None
        if replaced:
            binding = dataclasses.replace(binding, calls=[
                dataclasses.replace(c, kernel=replaced.get(id(c.node), c.kernel)) for c in binding.calls])
        self._replaced = set(replaced or ())
        self.graph, self.binding, self.filename = graph, binding, filename
        self.memo = shape_only_calls(graph, binding.calls)
        memo_nodes = {id(c.node) for c in self.memo.calls} if self.memo else set()
        self._shape_only = {id(o) for c in binding.calls if id(c.node) in memo_nodes for o in c.node.outputs}
        known = {id(v) for v in self.memo.results} if self.memo else set()
        self.program = ShapeProgram(graph, [c.node for c in binding.calls if id(c.node) not in memo_nodes], known)
        self.frames = FrameBuilder(name, graph, self.program, self.memo.results if self.memo else [], [],
                                   planner, device, declared)
        self.frames.shape_only_nodes = {c.node.name for c in binding.calls if id(c.node) in memo_nodes}
        self._views = {id(o) for c in binding.calls if view_input(c.node) is not None
                       for k, o in enumerate(c.node.outputs) if k == 0}
        self._probed = False
        self._generate()

    def _slotted(self, v: Value) -> bool:
        return (id(v) in self.program.determined and id(v) not in self._shape_only and id(v) not in self._views
                and (v.producer is None or id(v.producer) not in self._replaced)
                and "container" not in v.meta and v.dtype is not None and v.dtype.itemsize > 0)

    def variant(self, replaced: dict[int, Callable], suffix: str) -> "FrameRunner":
        """A runner of the same kernels (the same packed weights) in which the nodes of
        ``replaced`` run other kernels: its own code, frames and plans."""
        graph, planner, filename, name, device, declared, streams, threads = self._args
        return FrameRunner(graph, self.binding, planner, f"{filename}:{suffix}", name, device, declared, replaced,
                           streams, threads)

    def with_kernels(self, kernels: dict[int, Callable], suffix: str, tensors: list) -> "FrameRunner":
        """This runner with the calls of ``kernels`` (id(node) -> kernel) running those kernels,
        its own code, and this runner's frames (the same values slotted: the kernels write
        what the ones they stand for wrote). A node this runner replaced keeps its replacement.
        ``tensors``: a run's inputs, to probe this runner's shapes first (the probe may
        generate its code again, which the other code must follow)."""
        if self._stream_runner is not None:
            raise ValueError("a runner of several streams keeps the kernels of its stream plan")
        if not self._probed:
            self._probe(tensors)
        other = copy.copy(self)
        other.binding = with_kernels(self.binding, {k: v for k, v in kernels.items() if k not in self._replaced})
        other.filename = f"{self.filename}:{suffix}"
        other.code = generate_frame_run_function(self.graph, other.binding, self.memo, self.frames.planned,
                                                 other.filename, self.frames, control=other.binding.control)
        other.codes = [other.code]
        self.frames.envs.append(other.code.env)
        self.frames.arena_moved()
        return other

    def _generate(self) -> None:
        for call in self.binding.calls:
            call.out, call.guard = None, False
        values = frame_outputs(self.binding, self._slotted)
        self.frames.planned = values
        self.frames.reset_values()
        if self.streams is not None:
            if self._stream_runner is not None:
                self._stream_runner.close()
            from .streams_cpu import CpuStreamRunner
            self._stream_runner = CpuStreamRunner(self.graph, self.binding, self.streams, self.filename,
                                                  threads=self.threads, frames=self.frames, memo=self.memo,
                                                  frame_values=values, control=self.binding.control)
            self.code = self._stream_runner.code
            self.codes = [self.code]
            return
        self.code = generate_frame_run_function(self.graph, self.binding, self.memo, values, self.filename,
                                                self.frames, control=self.binding.control)
        self.codes = [self.code]
        self.frames.memo_fill = self.code.functions.get("_memo_fill")
        self.frames.envs = [self.code.env]      # their alias guard reads the arena's current range
        self.frames.arena_moved()

    def _probe(self, tensors: list) -> None:
        """Evaluate the shape program at the first run's shapes; regenerate if a node left it."""
        self._probed = True
        self.frames.dims(tensors)               # the feeds' dims first: a mismatch is the feeds' fault
        memo = {}
        if self.memo:
            memo = {id(v): t for v, t in zip(self.memo.results, self.frames.memo_fill(*tensors))}
        before = len(self.program.steps)
        try:
            self.program.probe([tuple(t.shape) for t in tensors], memo)
        except ValueError:
            return                              # the run itself reports the feeds' fault
        if len(self.program.steps) != before:
            self._generate()

    def __call__(self, tensors: list, hook: Callable | None = None) -> tuple:
        if not self._probed:
            self._probe(tensors)
        if self._stream_runner is not None:
            out = self._stream_runner(tensors, hook)
            self.codes = self._stream_runner.codes
            return out
        if hook is None:
            return self.code.function(*tensors)
        code = generate_frame_run_function(self.graph, self.binding, self.memo, self.frames.planned,
                                           self.filename + ":hook", self.frames, hook=hook,
                                           control=self.binding.control)
        self.frames.envs.append(code.env)
        self.frames.arena_moved()
        self.codes = [self.code, code]
        try:
            return code.function(*tensors)
        finally:
            self.frames.envs.remove(code.env)

    @property
    def arena(self):
        return self.frames.arena

    @property
    def adaptable(self) -> bool:
        """Its thread-bound kernels can be made again for another thread count (one stream)."""
        return self.streams is None

    def close(self) -> None:
        if self._stream_runner is not None:
            self._stream_runner.close()
        self.frames.clear()

