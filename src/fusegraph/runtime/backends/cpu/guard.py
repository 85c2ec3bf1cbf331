"""Kernels exact on NaN / Inf only when they must be: the fast form of a guarded node (a fused
relu, clip, GELU or hard sigmoid, a max pool without its finiteness check) runs whenever the
run's inputs make it exact, the exact form otherwise.

``guard_plan.py`` gives each guarded node a limit: while every float graph input is finite
with ``max |x| < limit``, no NaN or infinity can reach the node, so its fast kernel computes
what the exact one does. ``RunState.measure(feeds)`` finds the run's ``max |x|`` once before
the run (NaN in a feed makes it NaN, an infinity infinite: no limit admits either, an
unbounded one included); a ``Guarded`` kernel compares it with its limit on every call and
runs the fast kernel or the exact one (made at its first use, so a model whose inputs are
always finite never makes it).

Deep in a network the bounds that follow from the graph inputs alone grow past any limit. The
producer of a value such a node reads then measures it (``GuardPlan.measured``): right after
each call it takes the output's ``max |x|`` (one ``aminmax`` pass; NaN in it gives NaN) into
the run's ``m``, which only grows during a run (``Measuring``, or a ``Guarded`` producer's own
``measures``). The limits of every node that reads it, or anything computed from it,
assumed it bounded like the graph inputs, and they run after it: they compare the grown ``m``.

Called directly from generated code (``direct``: ``runtime/direct.py``), a guarded node's line
compares ``m`` with its limit itself and executes the fast kernel's call, or calls the
``Guarded`` (which then runs the exact kernel); a measured output is measured right after.
"""
from __future__ import annotations

import math
import threading
from typing import Callable, Mapping

import torch

from ....ops._tensor_util import dense_view
from ..protocol import Direct


class RunState:
    """What a run's guarded kernels read: the largest magnitude of its float feeds."""

    def __init__(self):
        self.m = 0.0               # before any run: the layout probe's zero feeds
        self.needed = False        # a guarded kernel was bound
        self._lock = threading.Lock()

    def measure(self, tensors, known: Mapping[int, float] | None = None) -> None:
        """``m`` of a run's feeds; ``known``: index -> a feed's largest magnitude as its
        caller keeps it (a KV session's cache: the most of the rows it appended), not read again."""
        self.m = 0.0
        if not known:
            self.see(tensors)
            return
        self.see([t for i, t in enumerate(tensors) if i not in known])
        for m in known.values():
            self.grow(m)

    def see(self, tensors) -> None:
        """Grow ``m`` by the largest magnitude of ``tensors`` (NaN: NaN from then on); streams
        may call it at once, and no growth is lost."""
        seen = 0.0
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                seen = _grown(seen, t, dense_view(t))
                if math.isnan(seen):
                    break
        self.grow(seen)

    def grow(self, seen: float) -> None:
        with self._lock:
            self.m = math.nan if math.isnan(seen) or math.isnan(self.m) else max(self.m, seen)


def _grown(seen: float, t: torch.Tensor, view: torch.Tensor | None) -> float:
    """``seen`` grown by ``t``'s largest magnitude (NaN in it: NaN), read through its one-axis
    ``view`` (``dense_view``), or a flattened copy where it has none."""
    lo, hi = extremes(t, view)
    return max(seen, -lo, hi) if not (math.isnan(lo) or math.isnan(hi)) else math.nan


def extremes(t: torch.Tensor, view: torch.Tensor | None = None) -> tuple[float, float]:
    """``t``'s smallest and largest element in one ``aminmax`` (NaN in both where it holds a
    NaN), over its bytes as they lie (``view``, else ``dense_view(t)``) or a flattened copy
    where they are not dense: ATen reduces a permuted tensor (channels-last data) through its
    strided path, many times slower."""
    if view is None:
        view = dense_view(t)
    lo, hi = torch.aminmax(t.reshape(-1) if view is None else view)
    return lo.item(), hi.item()


class Guarded:
    """A node's fast kernel while the run's inputs admit it, its exact kernel otherwise."""
    writes_out = True

    def __init__(self, fast, make_exact: Callable, limit: float, state: RunState, n_inputs: int,
                 measures: tuple[int, ...] = ()):
        self.fast, self._make_exact, self.limit, self.state = fast, make_exact, limit, state
        self.n_inputs = n_inputs
        self.reads = getattr(fast, "reads", None)
        self.impl = getattr(fast, "impl", "portable")
        self.measures = measures              # output indices measured after each call
        self._see = _Outputs(measures) if measures else None
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

    def direct(self, ts: tuple, out) -> Direct | None:
        d = _plain_direct(self.fast, ts, out)
        return None if d is None else Direct(d.call, self.limit, self.state, self._see)

    def __call__(self, *args, out=None):
        if self.state.m < self.limit:                # False for NaN, and for an infinite feed
            result = self.fast(*args, out=out)
        else:
            result = self.exact(*args, out=out)
        if self._see is not None:
            self._see(self.state, result, out is not None)
        return result


class Measuring:
    """A node's kernel followed by the measurement of the outputs ``measures`` (indices)."""

    def __init__(self, kernel, measures: tuple[int, ...], state: RunState, writes_out: bool):
        self.kernel, self.measures, self.state, self.writes_out = kernel, measures, state, writes_out
        self._see = _Outputs(measures)
        self.reads = getattr(kernel, "reads", None)
        self.impl = getattr(kernel, "impl", "portable")
        state.needed = True

    def direct(self, ts: tuple, out) -> Direct | None:
        d = _plain_direct(self.kernel, ts, out)
        return None if d is None else Direct(d.call, None, self.state, self._see)

    def __call__(self, *args, **kw):
        result = self.kernel(*args, **kw)
        self._see(self.state, result, kw.get("out") is not None)
        return result


class _Outputs:
    """The measurement of some outputs of a kernel. Written into planned views (``kept``), an
    output that is the same tensor as at the previous call reuses its one-axis view; one the
    kernel allocated (a probe run) is not kept alive. A strided output is flattened (a copy)."""

    def __init__(self, measures: tuple[int, ...]):
        self.measures = measures
        self._seen: list = [None] * len(measures)        # (tensor, its one-axis view) per output

    def __call__(self, state: RunState, result, kept: bool) -> None:
        outs = result if isinstance(result, (tuple, list)) else (result,)
        seen = 0.0
        for j, i in enumerate(self.measures):
            t = outs[i]
            last = self._seen[j]
            if last is None or last[0] is not t:
                if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
                    continue
                last = (t, dense_view(t))
                self._seen[j] = last if kept else None
            seen = _grown(seen, t, last[1])
        state.grow(seen)


def _plain_direct(kernel, ts: tuple, out) -> Direct | None:
    """``kernel``'s own direct call (neither guarded nor measuring), or None."""
    offer = getattr(kernel, "direct", None)
    d = offer(ts, out) if offer is not None else None
    return d if d is not None and d.limit is None and d.measure is None else None


def _reads(kernel, n_inputs: int) -> tuple:
    reads = getattr(kernel, "reads", None)
    return tuple(range(n_inputs)) if reads is None else tuple(reads)
