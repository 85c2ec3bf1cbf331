"""A decoder's KV cache kept inside fusegraph between steps, grown in place.

A decoder exported with its cache as graph inputs (``past_*``) and outputs (``present_*``)
computes each present as ``Concat(past, new, axis)``: every step copies the whole cache, and a
caller feeding the presents back as the next step's pasts copies it again (to NumPy and back).
``kv_pairs(graph)`` finds those pairs in the compiled graph (a graph output made by a Concat
whose first input is a graph input). A ``KVSession`` holds one ``CacheBuffer`` per pair, with
room for ``capacity`` positions along the concat axis, and runs a variant of the model's
generated code (``FrameRunner.variant``) in which each pair's Concat *appends* its new rows
after the past already in the buffer and returns the grown view: the past is never copied,
and the view is the next step's past input as it is. The attention reads the view (strided:
the buffer's rows are ``capacity`` apart); a step beyond the capacity grows the buffer to twice
its size (one copy of the cache, amortised over the steps that follow).

Each buffer keeps the largest ``|x|`` of the rows appended to it (NaN once one held a NaN): a
step hands it to the backend as its past's magnitude (``Backend.before_run``), so the guarded
kernels' check does not read the whole cache again every step.

A run that fails leaves the cache as it was before it (the lengths and magnitudes are
restored; the rows a failed step wrote past them are ignored). The buffers are the
session's, not the arena's: their bytes are reported apart (``KVSession.nbytes``). Nothing
here plans memory or generates code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from ..errors import ConfigError, InputError
from ..ir import Graph, Node, Value


SHAPE_READERS = ("Shape", "Size")     # read a past's shape, not its data: the view serves them


@dataclass(frozen=True)
class KVPair:
    output: str          # the graph output name (``present_*``)
    input: Value         # the graph input it feeds back into (``past_*``)
    node: Node           # the Concat making the output
    axis: int            # the concat axis (normalised, >= 0)


def kv_pairs(graph: Graph, output_names: list[str]) -> tuple[list[KVPair], list[str]]:
    """(the pairs, and why each other ``present``-like output is not one)."""
    inputs = {id(v): v for v in graph.inputs}
    pairs: list[KVPair] = []
    for name, v in zip(output_names, graph.outputs):
        node = v.producer
        if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx") \
                or len(node.inputs) != 2 or None in node.inputs or id(node.inputs[0]) not in inputs:
            continue
        past = node.inputs[0]
        rank = len(past.shape) if past.shape is not None else None
        axis = int(node.attrs.get("axis", 0))
        if rank is None or not -rank <= axis < rank:
            continue
        axis %= rank
        others = [n for n, _ in past.uses if n is not node and n.op_type not in SHAPE_READERS]
        if isinstance(past.shape[axis], int) or others:
            continue                      # a fixed past length, or the past's data read elsewhere too
        pairs.append(KVPair(name, past, node, axis))
    return pairs, []


class CacheBuffer:
    """One pair's cache: a tensor with room along ``axis``; ``length`` positions are the past."""

    def __init__(self, pair: KVPair, capacity: int):
        self.pair, self.capacity, self.length = pair, int(capacity), 0
        self.magnitude = 0.0       # the largest |x| of the rows appended (NaN once one held a NaN)
        self.tensor: torch.Tensor | None = None        # made at the first step (its other dims then known)
        self._current: torch.Tensor | None = None       # the view handed out as this step's past

    def past(self, template_shape: tuple[int, ...] | None, dtype: torch.dtype) -> torch.Tensor:
        """This step's past: the first ``length`` positions (an empty past before the first
        step, shaped like the input's other dims as given by ``template_shape``)."""
        axis = self.pair.axis
        if self.tensor is None:
            shape = list(template_shape or ())
            if len(shape) != len(self.pair.input.shape or ()) or \
                    any(d is None for i, d in enumerate(shape) if i != axis):
                raise InputError(f"input {self.pair.input.name!r}: the KV cache cannot tell its dims "
                                 f"{list(self.pair.input.shape or ())} from the other inputs; give them with "
                                 f"run(..., past_shapes={{{self.pair.input.name!r}: (...)}})")
            shape[axis] = self.capacity
            with torch.inference_mode(False):
                self.tensor = torch.empty(shape, dtype=dtype)
        current = self._current
        if current is None or current.shape[axis] != self.length or current.data_ptr() != self.tensor.data_ptr():
            self._current = self.tensor.narrow(axis, 0, self.length)     # else the last append's grown view
        return self._current

    def append(self, past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The Concat of this pair, in place: ``new`` written after the past, the grown view."""
        axis = self.pair.axis
        if past is not self._current:
            raise RuntimeError(f"the KV cache of {self.pair.output!r} was handed another past tensor")
        if tuple(new.shape[:axis]) + tuple(new.shape[axis + 1:]) != \
                tuple(past.shape[:axis]) + tuple(past.shape[axis + 1:]) or new.dtype != past.dtype:
            raise ValueError(f"Concat of the KV cache {self.pair.output!r}: new rows {tuple(new.shape)} "
                             f"{new.dtype} do not match the cache {tuple(past.shape)} {past.dtype}")
        n = int(new.shape[axis])
        if self.length + n > self.capacity:
            self._grow(self.length + n)
        self.tensor.narrow(axis, self.length, n).copy_(new)
        self.magnitude = _grown_magnitude(self.magnitude, new)
        self.length += n
        self._current = self.tensor.narrow(axis, 0, self.length)
        return self._current

    def _grow(self, needed: int) -> None:
        axis = self.pair.axis
        capacity = max(needed, 2 * self.capacity, 16)
        shape = list(self.tensor.shape)
        shape[axis] = capacity
        with torch.inference_mode(False):
            grown = torch.empty(shape, dtype=self.tensor.dtype)
        grown.narrow(axis, 0, self.length).copy_(self.tensor.narrow(axis, 0, self.length))
        self.tensor, self.capacity = grown, capacity

    @property
    def nbytes(self) -> int:
        return 0 if self.tensor is None else self.tensor.numel() * self.tensor.element_size()


class KVSession:
    """Runs a decoder step by step with its KV cache kept here (``CompiledModel.kv_cache``)."""

    def __init__(self, executor, pairs: list[KVPair], capacity: int):
        runner = executor.frame_runner          # a ConfigError for a model of fixed shapes
        if not pairs:
            raise ConfigError(f"{executor.model_name}: no graph output is a Concat of a graph input and a new "
                              f"tensor along a symbolic axis (a decoder's present = Concat(past, new)): there "
                              f"is no KV cache to keep")
        self.executor = executor
        self.buffers = [CacheBuffer(p, capacity) for p in pairs]
        by_node = {id(b.pair.node): b for b in self.buffers}
        replaced = {k: (lambda past, new, out=None, _b=b: _b.append(past, new)) for k, b in by_node.items()}
        self.runner = runner.variant(replaced, "kv")
        self.past_names = {b.pair.input.name for b in self.buffers}
        self.present_names = {b.pair.output for b in self.buffers}
        # per graph input, the buffer that feeds it (None: the caller does); per output, whether run() returns it
        self._fed = [next((b for b in self.buffers if b.pair.input is v), None) for v in executor.inputs]
        self._returned = [n not in self.present_names for n in executor.output_names]

    @property
    def length(self) -> int:
        return self.buffers[0].length

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def cache(self, output: str) -> np.ndarray:
        """A copy of the cache kept for ``output`` (a ``present`` output): what the model's last
        run would have returned as it."""
        b = next((b for b in self.buffers if b.pair.output == output), None)
        if b is None:
            raise InputError(f"{self.executor.model_name}: {output!r} is not a cache this session keeps "
                             f"(it keeps {sorted(self.present_names)})")
        if b.tensor is None:
            raise InputError(f"{self.executor.model_name}: the cache {output!r} is empty: no step ran yet")
        return b.tensor.narrow(b.pair.axis, 0, b.length).numpy().copy()

    def reset(self) -> None:
        """Start a new sequence (the buffers are kept and reused)."""
        for b in self.buffers:
            b.length, b.magnitude = 0, 0.0

    def run(self, feeds: Mapping[str, Any], past_shapes: Mapping[str, tuple] | None = None) -> dict[str, Any]:
        ex = self.executor
        given = [k for k in feeds if k in self.past_names]
        if given:
            raise InputError(f"{ex.model_name}: the KV session feeds {', '.join(map(repr, given))} itself; "
                             f"give only the other inputs")
        kept = [(b.length, b.magnitude) for b in self.buffers]
        with ex.lock:
            tensors = ex.convert_feeds_except(feeds, self.past_names)
            magnitudes = {}
            for i, (v, b) in enumerate(zip(ex.inputs, self._fed)):
                if b is not None:
                    shape = None if b.tensor is not None else \
                        (past_shapes or {}).get(v.name) or _template(v, tensors, ex.inputs)
                    tensors[i] = b.past(shape, v.dtype.to_torch())
                    magnitudes[i] = b.magnitude
            try:
                outs = ex.run_tensors(tensors, runner=self.runner, magnitudes=magnitudes)
            except BaseException:
                for b, (n, m) in zip(self.buffers, kept):
                    b.length, b.magnitude = n, m
                raise
            return ex.outputs_to_numpy(tensors, outs, self._returned, self.runner)


def _grown_magnitude(seen: float, rows: torch.Tensor) -> float:
    """``seen`` grown by the largest ``|x|`` of ``rows`` (NaN stays NaN; an infinity is infinite)."""
    if math.isnan(seen) or not rows.is_floating_point() or not rows.numel():
        return seen
    lo, hi = torch.aminmax(rows)          # one pass; NaN propagates into both
    lo, hi = float(lo), float(hi)
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(seen, -lo, hi)


def _template(v: Value, tensors: list, inputs: list[Value]) -> tuple[int, ...] | None:
    """The first step's past shape (its symbolic dims from the other inputs' dims; the past
    length 0), or None when a dim is known from nothing."""
    sizes: dict[str, int] = {}
    for w, t in zip(inputs, tensors):
        if t is not None and w.shape is not None:
            for d, n in zip(w.shape, t.shape):
                if isinstance(d, str):
                    sizes.setdefault(d, int(n))
    out = []
    for axis, d in enumerate(v.shape or ()):
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in sizes:
            out.append(sizes[d])
        else:
            out.append(None)
    return tuple(out)
