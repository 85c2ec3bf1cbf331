"""``FrameRunner``: how a model with symbolic input dims runs, on one stream: one binding and
one generated function for every input shape.

At bind time it builds the shape program (``shape_program.py``): the values that follow from
the inputs' shapes alone (position ids, masks, reshape targets, a ``Shape`` of an activation
and the arithmetic after it) are computed once per input shape and held in the frame, and
every other value's shape is evaluated from them. It finds which calls write into the arena
(``bind.frame_outputs``: the outputs whose shapes are known before the run, that are not views
and not graph outputs), and generates the run function (``codegen.generate_frame_run_function``)
whose first lines take the frame of the inputs' shapes (``frames.py``: made on a miss, kept
after). The first run also probes the shape program at its (valid) shapes: a node whose
kernel turns out to need data to know its output shape becomes dynamic (its kernel
allocates), and the function is generated again, once. A graph output is the tensor its
kernel made, handed to the caller as it is (one in the arena would be copied out after every
run). ``with_kernels`` gives the same runner with some calls running other kernels (made for
another thread count) and its own code, sharing the frames (one arena, one set of plans).
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
from .shape_memo import ShapeMemo
from .shape_program import ShapeProgram


class FrameRunner:
    varying_allocations = True       # its runs allocate outputs and temporaries whose sizes follow the shapes

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
        # every value that follows from the inputs' shapes is computed by the shape program,
        # once per input shape (the shape-only work included): the frame holds it
        self._outputs = {id(v) for v in graph.outputs}
        self.program = ShapeProgram(graph, [c.node for c in binding.calls], set(),
                                    {id(c.node): c for c in binding.calls})
        self.memo = ShapeMemo([], [])
        self.frames = FrameBuilder(name, graph, self.program, [], [], planner, device, declared)
        self._views = {id(o) for c in binding.calls if view_input(c.node) is not None
                       for k, o in enumerate(c.node.outputs) if k == 0}
        self._probed = False
        self._generate()

    def _held(self) -> None:
        """The frame's held values: the shape-only results, then the computed ones (the
        program's, after any probe dropped some)."""
        self.memo.computed = self.program.computed_nodes
        self.memo.computed_results = self.program.results
        skipped = self.memo.skipped()
        self._shape_only = {id(o) for c in self.binding.calls if id(c.node) in skipped for o in c.node.outputs}
        self.frames.memo_results = self.memo.held
        self.frames.shape_only_nodes = {c.node.name for c in self.binding.calls if id(c.node) in skipped}

    def _slotted(self, v: Value) -> bool:
        """Planned in the arena: a determined activation that is not computed in the frame,
        not a view, and not a graph output (an output's kernel makes its own tensor, which is
        handed to the caller as it is: in the arena it would be copied out after every run)."""
        return (id(v) in self.program.determined and id(v) not in self._shape_only and id(v) not in self._views
                and id(v) not in self._outputs
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
        self._held()
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
        self.frames.envs = [self.code.env]      # their alias guard reads the arena's current range
        self.frames.arena_moved()

    def _probe(self, tensors: list) -> None:
        """Evaluate the shape program at the first run's shapes; regenerate if a node left it."""
        self._probed = True
        self.frames.dims(tensors)               # the feeds' dims first: a mismatch is the feeds' fault
        memo = {}
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

