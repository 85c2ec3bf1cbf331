"""Kernels exact on NaN / Inf only when they must be: the fast form of a guarded node (a fused
relu, clip, GELU or hard sigmoid, a max pool without its finiteness check) runs whenever the
run's inputs make it exact, the exact form otherwise.

``runtime/finite.py`` gives each guarded node a limit: while every float graph input is finite
with ``max |x| < limit``, no NaN or infinity can reach the node, so its fast kernel computes
what the exact one does. ``RunState.measure(feeds)`` finds the run's ``max |x|`` once before
the run (NaN in a feed makes it NaN, an infinity infinite: no limit admits either, an
unbounded one included); a ``Guarded`` kernel compares it with its limit on every call and
runs the fast kernel or the exact one (made at its first use, so a model whose inputs are
always finite never makes it).

Deep in a network the bounds that follow from the graph inputs alone grow past any limit. A
guarded node may then measure its own large inputs (``GuardPlan.measured``): on every call it
takes their ``max |x|`` (one ``aminmax`` pass; NaN in them gives NaN) into the run's ``m``, which
only grows during a run, before comparing. The limits of everything computed from its output
assumed those inputs bounded like the graph inputs, and it ran before them: they compare the
grown ``m``.
"""
from __future__ import annotations

import math
import threading
from typing import Callable

import torch


class RunState:
    """What a run's guarded kernels read: the largest magnitude of its float feeds."""

    def __init__(self):
        self.m = 0.0               # before any run: the layout probe's zero feeds
        self.needed = False        # a guarded kernel was bound
        self._lock = threading.Lock()

    def measure(self, tensors) -> None:
        self.m = 0.0
        self.see(tensors)

    def see(self, tensors) -> None:
        """Grow ``m`` by the largest magnitude of ``tensors`` (NaN: NaN from then on); streams
        may call it at once, and no growth is lost."""
        seen = 0.0
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                lo, hi = (float(x) for x in torch.aminmax(_flat(t)))
                seen = max(seen, -lo, hi) if not (math.isnan(lo) or math.isnan(hi)) else math.nan
                if math.isnan(seen):
                    break
        with self._lock:
            self.m = math.nan if math.isnan(seen) or math.isnan(self.m) else max(self.m, seen)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as one axis: a view when its bytes are dense in any axis order (a
    channels-last activation), a copy otherwise."""
    if t.is_contiguous():
        return t.reshape(-1)
    dims = sorted(range(t.dim()), key=lambda d: t.stride(d))
    step = 1
    for d in dims:
        if t.size(d) != 1 and t.stride(d) != step:
            return t.reshape(-1)
        step *= t.size(d)
    return t.as_strided((t.numel(),), (1,))


class Guarded:
    """A node's fast kernel while the run's inputs admit it, its exact kernel otherwise."""
    writes_out = True

    def __init__(self, fast, make_exact: Callable, limit: float, state: RunState, n_inputs: int,
                 measured: tuple[int, ...] = ()):
        self.fast, self._make_exact, self.limit, self.state = fast, make_exact, limit, state
        self.n_inputs = n_inputs
        self.reads = getattr(fast, "reads", None)
        self.impl = getattr(fast, "impl", "portable")
        reads = _reads(fast, n_inputs)
        if any(i not in reads for i in measured):
            raise RuntimeError("a guarded node measures an input its kernel is not given")
        self.measured = tuple(reads.index(i) for i in measured)     # positions in the call's arguments
        self._exact = None
        state.needed = True

    @property
    def exact(self):
        if self._exact is None:
            exact = self._make_exact()
            if _reads(exact, self.n_inputs) != _reads(self.fast, self.n_inputs):
                raise RuntimeError("the exact kernel of a guarded node reads other inputs than its fast one")
            self._exact = exact
        return self._exact

    def __call__(self, *args, out=None):
        if self.measured:
            self.state.see([args[i] for i in self.measured])
        if self.state.m < self.limit:                # False for NaN, and for an infinite feed
            return self.fast(*args, out=out)
        return self.exact(*args, out=out)


def _reads(kernel, n_inputs: int) -> tuple:
    reads = getattr(kernel, "reads", None)
    return tuple(range(n_inputs)) if reads is None else tuple(reads)
