"""Frames: what a model with symbolic input dims needs per input shape, made when a shape is
first seen and kept, so that a run at a never-seen shape costs about what a warm run costs.

A frame is one tuple: the values of the run that follow from its input shapes alone
(``shape_program.py``'s computed values: position ids, masks, reshape targets) followed by
one arena view per planned activation, with that run's shapes, at the offsets of the memory
plan the shape runs in. The generated run function looks its inputs' shapes up in the frame
cache and unpacks the frame into its locals; on a miss it calls ``FrameBuilder``, which

1. checks the inputs' symbolic dims (the same symbol the same size; inside a declared range,
   else ``InputError`` naming the input, the dim and the range);
2. evaluates the shape program: the computed values and every activation's shape (the ops'
   rules; a step whose inputs are the last frame's repeats its result);
3. takes the kept memory plan the shape fits (every activation within its slot, every
   in-place pair of one shape), or has the planner the compiler handed over make one with
   its slots rounded up (``plan/buckets.py``: a bucket of shapes; the order is fixed, only
   offsets are planned): for this shape, or, where the symbolic dims grew by one amount
   since the newest plan (a decoder's past, a token a step), for a shape ahead of it (the
   largest grown dim at the next power of two), so that a decoder plans a few times, not
   every few tokens;
4. views the arena at those offsets with those shapes (the arena grows to the largest plan
   in use; growing drops the frames kept, whose views point at the old buffer);
5. where the dims grew by the same amount at the last two misses (a decoder's past, a token
   a step), makes the frames of the next ``FRAMES_AHEAD`` steps of that growth too, while a
   kept plan serves them: right after a frame the shape program's objects are in the CPU's
   caches, and a decoder's step evicts them by streaming its weights, so a frame made at the
   next step's start would pay their misses again.

Frames are kept first made, first out (``capacity`` of them, whose computed tensors hold at
most ``FRAME_BYTES`` of private memory: a view of a constant holds none), plans least recently
used first out (``PLANS_KEPT``).
``stats`` counts frames (made at a miss, and made ahead) and plans made and the seconds they
took, for the report. Nothing here runs a kernel on the model's activations or chooses an
order.
"""
from __future__ import annotations

import functools
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import InputError
from ..ir import Graph, Value
from ..plan.buckets import slot_capacity
from .feeds import empty_symbolic_dims
from .shape_program import ShapeProgram

SHAPE_ONLY = "shape-only work, done once per input shape: its result is kept in the frame"
FRAMES_KEPT = 256
FRAME_BYTES = 8 << 20        # the private bytes the kept frames' computed tensors may hold, together (a frame
                             # made again costs a shape evaluation; kept ones cost private memory)
PLANS_KEPT = 64
FRAMES_AHEAD = 16            # a decoder's next frames made with one (``FrameBuilder._make_ahead``)


@dataclass
class MemoryBucket:
    """One memory plan of a model with symbolic dims and the shapes it serves: made for the
    dims ``made_for`` with every slot rounded up (``plan.buckets.slot_capacity``), it runs
    every later shape whose activations fit their slots. ``slots``: value name -> (offset,
    size); ``inplace``: (input, output) value pairs sharing bytes; ``largest``: the shapes of
    the largest run it served (by its planned bytes), for its lower bound in the report."""
    made_for: dict[str, int]
    slots: dict[str, tuple[int, int]]
    inplace: list[tuple[str, str]]
    arena_bytes: int
    capacity_lower_bound_bytes: int
    seconds: float
    served: dict[str, int] = field(default_factory=dict)     # the largest size of each dim framed in it
                                                             # (run, or made ahead for a decoder's next steps)
    largest: dict[int, tuple] | None = None       # the shapes of the largest run (by its planned bytes)
    largest_bytes: int = -1
    runs: int = 0
    pairs: list = field(default_factory=list)      # the in-place pairs' values (input, output)
    limits: list = field(default_factory=list)     # each planned value's slot bytes, in ``planned`` order

    def serve(self, dims: dict[str, int], shapes: dict[int, tuple], planned_bytes: int) -> None:
        self.runs += 1
        for name, n in dims.items():
            self.served[name] = max(self.served.get(name, 0), n)
        if planned_bytes > self.largest_bytes:
            self.largest, self.largest_bytes = shapes, planned_bytes


class GrowingArena:
    """The activation arena of a model with symbolic dims: one uint8 buffer, reallocated larger
    when a plan needs more (``generation`` counts the reallocations)."""

    def __init__(self, device):
        self.device = device
        self.tensor = torch.empty(0, dtype=torch.uint8, device=device)
        self.nbytes = 0
        self.generation = 0
        self._typed: dict[torch.dtype, torch.Tensor] = {}      # the arena read as each dtype

    def ensure(self, nbytes: int) -> bool:
        """Make the arena at least ``nbytes`` long; True when it was reallocated."""
        if nbytes <= self.nbytes:
            return False
        with torch.inference_mode(False):
            self.tensor = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
        self.nbytes = int(nbytes)
        self.generation += 1
        self._typed: dict[torch.dtype, torch.Tensor] = {}
        return True

    @property
    def lo(self) -> int:
        return self.tensor.data_ptr()

    @property
    def hi(self) -> int:
        return self.tensor.data_ptr() + self.nbytes

    def contains(self, t: torch.Tensor) -> bool:
        return t.numel() > 0 and self.lo <= t.data_ptr() < self.hi

    def view(self, offset: int, shape: tuple, dtype: torch.dtype, nhwc: bool) -> torch.Tensor:
        """The arena's bytes from ``offset`` as a dense tensor of ``shape`` (channels-last for
        an ``nhwc`` value of rank 3 or 4): one ``as_strided`` of the arena read as ``dtype``
        (every slot starts at a multiple of 64 bytes, so of the item size)."""
        typed = self._typed.get(dtype) if self.nbytes else None
        if typed is None:
            itemsize = _ITEMSIZE.get(dtype) or torch.empty((), dtype=dtype).element_size()
            typed = self.tensor[:self.nbytes - self.nbytes % itemsize].view(dtype)
            if self.nbytes:
                self._typed[dtype] = typed
        itemsize = typed.element_size()
        if nhwc and len(shape) in (3, 4):
            b, c, *spatial = shape
            strides = _dense_strides((b, *spatial, c))
            strides = (strides[0], strides[-1], *strides[1:-1])
        else:
            strides = _dense_strides(shape)
        return typed.as_strided(shape, strides, offset // itemsize)


@functools.lru_cache(maxsize=4096)
def _dense_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


_ITEMSIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.int64: 8, torch.int32: 4,
             torch.bool: 1, torch.uint8: 1, torch.int8: 1, torch.float64: 8, torch.int16: 2}


class FrameBuilder:
    """Makes and keeps the frames of one bound model with symbolic input dims."""

    def __init__(self, name: str, graph: Graph, program: ShapeProgram, memo_results: list[Value],
                 planned: list[Value], planner: Callable[[dict, bool], object], device,
                 declared: dict[str, tuple[int, int]] | None = None, capacity: int = FRAMES_KEPT):
        self.name = name
        self.graph = graph
        self.program = program
        self.memo_results = list(memo_results)
        self.planned = list(planned)
        self.planner = planner
        self.declared = dict(declared or {})
        self.capacity = capacity
        self.arena = GrowingArena(device)
        self.frames: OrderedDict[tuple, tuple] = OrderedDict()
        self._last_views = None     # (plan, arena generation, shapes, views) of the last frame made
        self._bytes: dict[tuple, int] = {}         # per kept frame, the bytes of its computed tensors
        self.frame_bytes = 0
        self._const_ptrs: set[int] | None = None     # the graph constants' storages (``_held_bytes``)
        self.plans: OrderedDict[int, MemoryBucket] = OrderedDict()
        self.on_plan: Callable | None = None         # called with each new memory plan (the model's report)
        self.memo_storages: dict[int, int] = {}      # storage -> kept frames holding a shape-only tensor there
        self.stats = {"frames": 0, "frames_ahead": 0, "frame_seconds": 0.0, "plans": 0, "plan_seconds": 0.0,
                      "planned_alone": 0}
        self._last_dims: dict[str, int] | None = None     # the dims of the last frame made
        self._last_step: dict[str, int] | None = None     # how they grew from the frame before
        self._symbols = _input_symbols(graph)
        self.shape_only_nodes: set[str] = set()     # the nodes the frame computes (set after codegen)
        self._plan_ids = itertools.count()
        self.envs: list[dict] = []          # generated modules whose ``_AL`` / ``_AH`` follow the arena
        self.reset_values()

    def reset_values(self) -> None:
        """After ``planned`` changed (the code was generated again): no frame or plan kept."""
        self._dtypes = [v.dtype.to_torch() for v in self.planned]
        self._nhwc = [v.layout == "nhwc" for v in self.planned]
        self._planned_items = [(id(v), v.dtype.itemsize) for v in self.planned]
        self._by_name = {o.name: o for n in self.graph.nodes for o in n.outputs}
        self.clear()
        self.plans.clear()

    def arena_moved(self) -> None:
        for env in self.envs:
            env["_AL"], env["_AH"] = self.arena.lo, self.arena.hi

    # -- the generated code's entry on a cache miss
    def __call__(self, *inputs) -> tuple:
        t0 = time.perf_counter()
        dims = self.dims(inputs)
        frame = self._make(tuple(t.shape for t in inputs), dims, inputs, may_plan=True)
        self.stats["frames"] += 1
        self.stats["frame_seconds"] += time.perf_counter() - t0
        self._make_ahead(dims, inputs)
        return frame

    def _make(self, key: tuple, dims: dict[str, int], inputs, may_plan: bool) -> tuple | None:
        """The frame of inputs of shapes ``key``, kept; None where ``may_plan`` is False and no
        kept plan serves the shape."""
        memo: dict[int, torch.Tensor] = {}
        try:
            shapes = self.program.evaluate([tuple(s) for s in key], {}, computed=memo)
        except ValueError as exc:
            raise InputError(f"{self.name}: the model cannot run at input shapes "
                             f"{_describe_inputs(self.graph, inputs)}"
                             f"{empty_symbolic_dims(self.graph.inputs, [tuple(s) for s in key])}: {exc}") from None
        plan = self._plan_for(dims, shapes, inputs, may_plan)
        if plan is None:
            return None
        views = self._views(plan, shapes)
        held = tuple(memo[id(v)] for v in self.memo_results)
        frame = held + tuple(views)
        nbytes = self._held_bytes(held)
        self.frames[key] = frame
        self._bytes[key] = nbytes
        self.frame_bytes += nbytes
        for t in held:
            if isinstance(t, torch.Tensor) and t.numel():
                ptr = t.untyped_storage().data_ptr()
                self.memo_storages[ptr] = self.memo_storages.get(ptr, 0) + 1
        while len(self.frames) > 1 and (len(self.frames) > self.capacity or self.frame_bytes > FRAME_BYTES):
            old, dropped = self.frames.popitem(last=False)
            self.frame_bytes -= self._bytes.pop(old)
            for t in dropped[:len(self.memo_results)]:
                if isinstance(t, torch.Tensor) and t.numel():
                    ptr = t.untyped_storage().data_ptr()
                    if self.memo_storages.get(ptr, 0) <= 1:
                        self.memo_storages.pop(ptr, None)
                    else:
                        self.memo_storages[ptr] -= 1
        return frame

    def _held_bytes(self, held: tuple) -> int:
        """The private bytes of a frame's computed tensors: each storage once, and none of a
        constant's (a slice or an expand of a table is a view of it)."""
        if self._const_ptrs is None:
            self._const_ptrs = {v.const.untyped_storage().data_ptr() for v in self.graph.constants.values()
                                if v.const is not None and v.const.device.type != "meta" and v.const.numel()}
        seen: set[int] = set()
        nbytes = 0
        for t in held:
            if isinstance(t, torch.Tensor) and t.numel():
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in seen and ptr not in self._const_ptrs:
                    seen.add(ptr)
                    nbytes += storage.nbytes()
        return nbytes

    def _make_ahead(self, dims: dict[str, int], inputs) -> None:
        """A decoder's next frames, made now: where the symbolic dims grew by one amount since
        the last frame made, as they did the time before (a past and a mask a token a step),
        the frames of the next ``FRAMES_AHEAD`` steps of that growth, while a kept plan serves
        them. The program's objects are in the caches right after a frame; a decoder's step
        then streams its weights through them, and the next step's frame would find them cold.
        A shape the model cannot take, or outside a declared range, ends it silently (a run
        there raises as before)."""
        last, self._last_dims = self._last_dims, dims
        step = None if last is None else _grown_by_one_amount(last, dims)
        previous, self._last_step = self._last_step, step
        if step is None or step != previous:
            return
        t0 = time.perf_counter()
        made = 0
        ahead = dict(dims)
        for _ in range(min(FRAMES_AHEAD, self.capacity // 4)):
            ahead = {k: n + step.get(k, 0) for k, n in ahead.items()}
            fakes = self._shaped_like(inputs, ahead)
            key = tuple(t.shape for t in fakes)
            if key not in self.frames:
                try:
                    self.dims(fakes)
                    if self._make(key, ahead, fakes, may_plan=False) is None:
                        break
                except InputError:
                    break
                made += 1
            self._last_dims = ahead
        self.stats["frames_ahead"] += made
        self.stats["frame_seconds"] += time.perf_counter() - t0

    def _views(self, plan: MemoryBucket, shapes: dict[int, tuple]) -> list[torch.Tensor]:
        """The arena views of the planned values at ``shapes`` in ``plan``: the last frame's
        view of a value where the plan, the arena and the value's shape are the same (a
        decoder's step changes few shapes)."""
        last = self._last_views
        reuse = last is not None and last[0] is plan and last[1] == self.arena.generation
        views, got = [], []
        for i, (v, dtype, nhwc) in enumerate(zip(self.planned, self._dtypes, self._nhwc)):
            shape = shapes[id(v)]
            if reuse and last[2][i] == shape:
                views.append(last[3][i])
            else:
                views.append(self.arena.view(plan.slots[v.name][0], shape, dtype, nhwc))
            got.append(shape)
        self._last_views = (plan, self.arena.generation, got, views)
        return views

    def clear(self) -> None:
        self._last_views = None
        self.frames.clear()
        self._bytes.clear()
        self.frame_bytes = 0
        self.memo_storages.clear()

    # -- inputs
    def dims(self, inputs) -> dict[str, int]:
        """The symbolic dims' sizes in ``inputs`` (checked: one size per symbol, inside its
        declared range)."""
        dims: dict[str, int] = {}
        for (symbols, v), t in zip(self._symbols, inputs):
            for axis, sym in symbols:
                n = int(t.shape[axis])
                seen = dims.setdefault(sym, n)
                if seen != n:
                    raise InputError(f"{self.name}: input {v.name!r} dim {axis} ({sym!r}) is {n}, but another "
                                     f"input set {sym!r} = {seen}")
                rng = self.declared.get(sym)
                if rng is not None and not rng[0] <= n <= rng[1]:
                    raise InputError(f"{self.name}: input {v.name!r} dim {axis} ({sym!r}) is {n}, outside the "
                                     f"declared range {rng[0]}..{rng[1]} (Config.shapes)")
        fixed = self.graph.meta.get("fixed_batch")
        if isinstance(fixed, dict) and "batch" in dims and dims["batch"] != fixed.get("batch"):
            raise InputError(f"{self.name}: Config.dynamic_batch: at batch {dims['batch']}, output(s) "
                             f"{', '.join(map(repr, fixed.get('outputs', [])))} keep batch {fixed.get('batch')}: the "
                             f"graph fixes its batch size (a Reshape or Expand to a constant shape); export the "
                             f"model with a dynamic batch axis")
        return dims

    # -- plans
    def _plan_for(self, dims: dict[str, int], shapes: dict[int, tuple], inputs,
                  may_plan: bool = True) -> MemoryBucket | None:
        """The kept plan this shape fits (the most recently used first), else a new one:
        made for a larger shape where the dims are growing (``_projected``), else for this
        one, with every slot rounded up to its size's boundary (None instead where
        ``may_plan`` is False: a new plan may grow the arena, which drops the kept frames)."""
        need = self._planned_bytes(shapes)
        for key in reversed(self.plans):
            plan = self.plans[key]
            if self._fits(plan, need, shapes):
                self.plans.move_to_end(key)
                break
        else:
            if not may_plan:
                return None
            plan = None
            projected = self._projected(dims, inputs)
            if projected is not None:
                plan = self._plan_shapes(*projected)
                if not self._fits(plan, need, shapes):
                    plan = None
            if plan is None:
                plan = self._plan_shapes(dims, shapes)
        plan.serve(dims, shapes, sum(need))
        return plan

    def _projected(self, dims: dict[str, int], inputs) -> tuple[dict, dict] | None:
        """(dims, shapes) of a shape ahead of this one, when the symbolic dims that changed
        since the newest plan all grew by one amount (a decoder's past and mask, one token a
        step): each grown dim ahead by as much again as takes the largest of them to the next
        power of two, the others as they are; None otherwise, or where the model cannot take
        that shape. The computed values depend on the inputs' shapes alone, so those shapes (no
        data, no memory) give the projected frame's shapes."""
        if not self.plans:
            return None
        grown = _grown_by_one_amount(self.plans[next(reversed(self.plans))].made_for, dims)
        if grown is None:
            return None
        top = max(dims[k] for k in grown)
        ahead = (1 << top.bit_length()) - top           # the largest grown dim to the next power of two
        projected = {k: n + ahead if k in grown else n for k, n in dims.items()}
        fakes = self._shaped_like(inputs, projected)
        try:
            self.dims(fakes)
            shapes = self.program.evaluate([tuple(t.shape) for t in fakes], {})
        except (InputError, ValueError, RuntimeError, TypeError, NotImplementedError):
            return None
        return projected, shapes

    def _shaped_like(self, inputs, dims: dict[str, int]) -> list["ShapeOnly"]:
        """The shapes and types of ``inputs`` with their symbolic dims at ``dims`` (no data, no
        memory): the inputs of a shape not run yet, as the frame reads them."""
        fakes = []
        for (symbols, _v), t in zip(self._symbols, inputs):
            shape = list(t.shape)
            for axis, sym in symbols:
                shape[axis] = dims[sym]
            fakes.append(ShapeOnly(torch.Size(shape), t.dtype))
        return fakes

    def _plan_shapes(self, dims: dict[str, int], shapes: dict[int, tuple]) -> MemoryBucket:
        sizes = self._sizes(shapes)
        return self._plan_sizes(dims, {k: slot_capacity(n) if isinstance(n, int) else n for k, n in sizes.items()},
                                shapes)

    def _plan_sizes(self, dims: dict[str, int], capacity: dict[str, int | None], shapes: dict[int, tuple]) -> MemoryBucket:
        t0 = time.perf_counter()

        def same_shape(node, members) -> bool:     # an in-place pair has one shape here
            out = shapes.get(id(node.outputs[0]))
            return all(shapes.get(id(m)) == out for m in members if any(m is v for v in node.inputs))
        mplan = self.planner(capacity, same_shape)
        seconds = time.perf_counter() - t0
        plan = MemoryBucket(dict(dims), mplan.slots(), [(d["input"], d["output"]) for d in mplan.report.inplace],
                            mplan.assignment.arena_bytes, mplan.lifetimes.lower_bound_bytes, seconds)
        plan.pairs = [(self._by_name.get(a), self._by_name.get(b)) for a, b in plan.inplace]
        plan.limits = [plan.slots[v.name][1] if v.name in plan.slots else -1 for v in self.planned]
        self.plans[next(self._plan_ids)] = plan
        while len(self.plans) > PLANS_KEPT:
            self.plans.popitem(last=False)
        if self.arena.ensure(plan.arena_bytes):
            self.clear()                   # every kept frame points at the old buffer
            self.arena_moved()
        self.stats["plans"] += 1
        self.stats["plan_seconds"] += seconds
        if self.on_plan is not None:
            self.on_plan(mplan)
        return plan

    def _sizes(self, shapes: dict[int, tuple]) -> dict[str, int | str | None]:
        """Every value's bytes at ``shapes`` (what the planner places), by name."""
        sizes: dict[str, int | str | None] = {}
        known = self.program.known           # shape-only values live in the frame, not the arena
        for node in self.graph.nodes:
            for o in node.outputs:
                s = shapes.get(id(o))
                if id(o) in known or node.name in self.shape_only_nodes:
                    sizes[o.name] = SHAPE_ONLY
                    continue
                if s is None or o.dtype is None or "container" in o.meta:
                    sizes[o.name] = None
                    continue
                n = 1
                for d in s:
                    n *= d
                sizes[o.name] = n * o.dtype.itemsize
        return sizes

    def _planned_bytes(self, shapes: dict[int, tuple]) -> list[int]:
        """The bytes of each planned value at ``shapes``, in ``planned`` order."""
        out = []
        for key, itemsize in self._planned_items:
            n = itemsize
            for d in shapes[key]:
                n *= d
            out.append(n)
        return out

    def _fits(self, plan: MemoryBucket, need: list[int], shapes: dict[int, tuple]) -> bool:
        for n, limit in zip(need, plan.limits):
            if n > limit:
                return False
        for va, vb in plan.pairs:
            if va is None or vb is None or shapes.get(id(va)) != shapes.get(id(vb)):
                return False
        return True

    def report(self) -> list[dict]:
        """The plans kept: the dims each was made for, the largest dims it ran, its arena, the
        lower bound at the largest shape it ran (the bytes live at once at its busiest step:
        what no plan of that shape can go below), and the seconds it took to make."""
        return [{"made_for": dict(p.made_for), "largest_served": dict(p.served), "runs": p.runs,
                 "arena_bytes": p.arena_bytes, "seconds": p.seconds,
                 "lower_bound_bytes": self.lower_bound(self._sizes(p.largest)) if p.largest else 0}
                for p in self.plans.values()]

    def lower_bound(self, sizes: dict[str, int | None]) -> int:
        """The most bytes live at once in the fixed order, with activations of ``sizes``."""
        return self.planner(sizes, None).lifetimes.lower_bound_bytes


class ShapeOnly:
    """An input's shape and type without a tensor (a frame made ahead reads nothing else)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape: torch.Size, dtype: torch.dtype):
        self.shape, self.dtype = shape, dtype


def _grown_by_one_amount(last: dict[str, int], dims: dict[str, int]) -> dict[str, int] | None:
    """The dims that grew from ``last`` to ``dims``, by how much, where all that changed grew
    by one positive amount (a decoder's past and mask, a token a step); None otherwise."""
    if last.keys() != dims.keys():
        return None
    grown = {k: n - last[k] for k, n in dims.items() if n != last[k]}
    if not grown or len(set(grown.values())) != 1 or next(iter(grown.values())) <= 0:
        return None
    return grown


def _input_symbols(graph: Graph) -> list[tuple[list[tuple[int, str]], Value]]:
    """Per graph input: its symbolic axes and their symbol (an unnamed dim is its own symbol)."""
    out = []
    for v in graph.inputs:
        axes = []
        for axis, d in enumerate(v.shape or ()):
            if not isinstance(d, int):
                axes.append((axis, d if isinstance(d, str) else f"{v.name}:{axis}"))
        out.append((axes, v))
    return out


def _describe_inputs(graph: Graph, inputs) -> str:
    return ", ".join(f"{v.name}: {list(t.shape)}" for v, t in zip(graph.inputs, inputs))
