"""Per-shape compiles of a model with symbolic input dims: what its runs actually execute.

A model exported with a dynamic batch or sequence axis cannot be planned or given shape-bound
kernels as it is: every activation's size depends on the feeds. So a run looks its feeds'
exact shapes up in a bounded cache of compiles of the model at those shapes, and compiles one
on a miss, as torch.compile recompiles for new shapes and TensorRT builds per optimisation
profile. Each compile is what a static model gets: the shape arithmetic folded, the fusions
that need known sizes, the memory plan (no unplannable activation), oneDNN primitives. The
compile that ``fg.compile`` returns keeps its shape-generic kernels for its report, its
artifact and ``Config.shape_cache=0``.

Why exact shapes rather than buckets padded up to a power of two: padding changes a model's
outputs unless every op masks the padding (attention without a mask, a normalisation over the
padded axis, a pooling), and oneDNN primitives are made for one shape anyway.

- The source of a model with symbolic dims is its optimised shape-generic graph (a copy taken
  before binding): a compile sets the input shapes, infers, runs the pipeline again (which now
  folds the shape arithmetic; the precision pass is not run again, its dtypes are in the
  graph), plans and binds.
- ``Config.dynamic_batch``: a static model's source is its imported graph before any pass (its
  optimised graph has the batch folded into constants), with every input's dim 0 the symbol
  ``batch``; each batch size gets the whole compile. A compile whose outputs do not follow the
  new batch (the graph fixes it in a constant) is refused with an InputError naming the output.
- ``Config.shape_cache`` compiles are kept; the least recently used goes first.
- Weights: each packed form is made once and shared by every compile whose weight has the
  same contents (``runtime.backends.weight_share``: a compile's passes may derive a weight anew). The source
  keeps its plain weights for the next compile, so a dynamic model holds them twice (plain and
  packed) where a static one holds them once.
- A loaded artifact of a model with symbolic dims does the same from its stored shape-generic
  graph: the load runs no pass, its first run at a new shape does. ``dynamic_batch`` needs the
  imported graph, which an artifact does not hold: a loaded static model keeps its batch.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import torch

from ..config import Config
from ..errors import FusegraphError, InputError
from ..ir import Graph
from ..ir.serialize import copy_graph
from ..ops import infer_graph
from ..runtime.feeds import convert_feeds, empty_symbolic_dims
from ..runtime.threads import intra_op_threads

if TYPE_CHECKING:
    from .model import CompiledModel

BATCH = "batch"
REFUSALS_KEPT = 64


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def specialization_kind(graph: Graph, config: Config) -> str | None:
    """How an imported ``graph``'s runs are compiled per shape: "shapes" (an input has a
    symbolic or unknown dim), "batch" (static inputs, ``Config.dynamic_batch``), or None
    (static inputs; ``shape_cache=0``; sequence or optional inputs)."""
    if config.shape_cache == 0 or any("container" in v.meta for v in graph.inputs):
        return None
    if not all(_static(v.shape) for v in graph.inputs):
        return "shapes"
    return "batch" if config.dynamic_batch else None


def _shape_of(feed: Any) -> tuple[int, ...] | None:
    shape = getattr(feed, "shape", None)
    try:
        return tuple(int(d) for d in (np.shape(feed) if shape is None else shape))
    except (TypeError, ValueError):
        return None


class ShapeSpecializations:
    """The compiles of one dynamic model at the input shapes its runs have seen."""

    def __init__(self, source: Graph, kind: str, config: Config, main: "CompiledModel", shared,
                 build: Callable[[Graph, Config], "CompiledModel"]):
        self.source = source
        self._names = frozenset(v.name for v in source.inputs)
        self.kind = kind
        if kind == "batch":
            for v in source.inputs:
                if v.shape:
                    v.shape = (BATCH, *v.shape[1:])
            self._pass_config = config
        else:          # the source is optimised: each compile folds its shapes, its precision is set
            self._pass_config = config.replace(precision="fp32", op_precision=(), accuracy_budget=1e-2)
        self._main_report = main.report
        self.name = main.name
        self.capacity = config.shape_cache
        self.threads = config.threads
        main_shapes = [v.shape for v in main.graph.inputs]
        self._main_key = tuple(main_shapes) if all(_static(s) for s in main_shapes) else None
        self._main_outputs = [o.shape for o in main.outputs]
        self._build = build
        self.shared = shared
        self._cache: OrderedDict[tuple, "CompiledModel"] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled: list[dict] = []     # one record per compile, in order (evicted ones too)
        self._refused: dict[tuple, str] = {}   # shapes a compile refused: refused again, not recompiled

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def kept(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of the compiles kept, least recently used first."""
        return [self._shapes(key) for key in self._cache]

    def close(self) -> None:
        """Close every compile kept and drop them (the model's ``close``)."""
        with self._lock:
            for model in self._cache.values():
                model.close()
            self._cache.clear()

    def _shapes(self, key: tuple) -> dict[str, tuple[int, ...]]:
        return {v.name: shape for v, shape in zip(self.source.inputs, key)}

    def model_for(self, feeds: Mapping[str, Any]) -> "CompiledModel | None":
        """The compile for ``feeds``' shapes (made now on a miss); None where the model's own
        compile runs them (its static shapes) or where the feeds are malformed (its feed checks
        then name the fault)."""
        if not isinstance(feeds, Mapping) or feeds.keys() != self._names:
            return None
        key = tuple(_shape_of(feeds[v.name]) for v in self.source.inputs)
        if any(k is None for k in key) or key == self._main_key:
            return None
        return self._get(key, feeds)

    def _get(self, key: tuple, feeds: Mapping[str, Any]) -> "CompiledModel":
        """The compile kept for ``key`` (now the most recently used), else ``feeds`` checked
        against the inputs' specs (an InputError naming a bad one) and the compile made."""
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                return got
        convert_feeds(self.name, self.source.inputs, feeds)
        return self._compile(key)

    def at(self, shapes: Mapping[str, tuple[int, ...]]) -> "CompiledModel":
        """The compile at ``{input: shape}``, made now if it is not kept."""
        names = [v.name for v in self.source.inputs]
        if not isinstance(shapes, Mapping) or shapes.keys() != self._names:
            raise InputError(f"{self.name}: give a shape for each input {names}, got {shapes!r}")
        feeds = {}
        for v in self.source.inputs:
            shape = shapes[v.name]
            if not isinstance(shape, (tuple, list)) or not all(
                    isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise InputError(f"{self.name}: input {v.name!r}: a shape is a list of non-negative "
                                 f"integers, got {shape!r}")
            feeds[v.name] = torch.empty(tuple(shape), dtype=v.dtype.to_torch(), device="meta")  # checks only
        return self._get(tuple(tuple(int(d) for d in shapes[n]) for n in names), feeds)

    def _compile(self, key: tuple) -> "CompiledModel":
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            if key in self._refused:
                raise InputError(self._refused[key])
            started = time.perf_counter()
            graph = copy_graph(self.source)
            for v, shape in zip(graph.inputs, key):
                v.shape = shape
            described = ", ".join(f"{n}: {list(s)}" for n, s in self._shapes(key).items())
            try:
                with intra_op_threads(self.threads):
                    infer_graph(graph)
                    model = self._build(graph, self._pass_config)
                if self.kind == "batch":
                    self._check_batch(model, key, described)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - a compile at shapes the model's arithmetic cannot take
                why = str(exc) if isinstance(exc, FusegraphError) else f"{type(exc).__name__}: {exc}"
                message = str(exc) if isinstance(exc, InputError) else \
                    f"{self.name}: the model cannot run at input shapes {described}{empty_symbolic_dims(self.source.inputs, key)}: {why}"
                self._refused[key] = message
                if len(self._refused) > REFUSALS_KEPT:
                    del self._refused[next(iter(self._refused))]
                raise InputError(message) from exc
            if self.kind != "batch":
                self._whole_story(model.report)
            self._cache[key] = model
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
            memory = model.report.memory
            self.compiled.append({"shapes": self._shapes(key), "seconds": time.perf_counter() - started,
                                  "arena_bytes": memory.arena_bytes if memory else None,
                                  "lower_bound_bytes": memory.lower_bound_bytes if memory else None,
                                  "unplannable": len(memory.unplannable) if memory else 0,
                                  "kernel_count": model.report.kernel_count})
            return model

    def _whole_story(self, report) -> None:
        """A compile from the optimised source reports the passes from the import on: the
        shape-generic compile's, then its own; its dtypes are the generic compile's."""
        main = self._main_report
        report.nodes_imported = main.nodes_imported
        report.passes = list(main.passes) + list(report.passes)
        report.fusions = list(main.fusions) + list(report.fusions)
        report.precision = main.precision

    def _check_batch(self, model: "CompiledModel", key: tuple, described: str) -> None:
        """Under ``dynamic_batch``: every output whose dim 0 was the compiled batch follows the
        new one, or the graph fixed the batch somewhere and the outputs would be wrong."""
        if self._main_key is None or not self._main_key[0]:
            return
        old, new = self._main_key[0][0], key[0][0] if key[0] else None
        for spec, before in zip(model.outputs, self._main_outputs):
            if before and before[0] == old and spec.shape and spec.shape[0] != new:
                raise InputError(f"{self.name}: Config.dynamic_batch: at input shapes {described}, output "
                                 f"{spec.name!r} has shape {list(spec.shape)}, not batch {new}: the graph fixes "
                                 f"its batch size (a Reshape or Expand to a constant shape); export the "
                                 f"model with a dynamic batch axis")
