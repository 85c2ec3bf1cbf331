"""Kernel calls the generated code makes itself, without the kernel's Python path.

A kernel whose tensors are the same on every run (it writes a planned arena view and reads
only arena views and constants) may offer ``direct(tensors, out)`` (``backends/protocol.py``
``Direct``): its prepared call. The call's line is then the call itself (here the function's
direct call 3)::

    if (_s := _dx[3](_dp[3], _st, 4, _da[3])): _df(3, _s)

a guarded node (``backends/cpu/guard.py``) runs it only while the run's magnitude is below its
limit (``not ... <``: a NaN magnitude takes the kernel), and a producer whose output the guards
measure measures it after the call::

    if not _dr[3].m < _dl[3]: k5(a2, out=a3)
    else:
        if (_s := _dx[3](_dp[3], _st, 4, _da[3])): _df(3, _s)
        _dm[3](_dr[3], a3, True)

A Python call into the kernel costs microseconds when the interpreter's data is in the caches
and several times that when a large kernel has just evicted it, as inside a run: the direct
lines take less time than the calls through Python on the light models in bf16
(``benchmarks/direct_calls.py``; benchmarks/RESULTS.md, "direct calls"). ``ThreadEntry``, called
once at the top of the function, returns the calls' parts as the locals above, and ``_st``, the
stream of the thread running it: it points every direct call of the function at that thread's
scratchpad when the thread is not the previous run's. The parts are kept in lists indexed by
literals, not as a global each, so the module's name table does not grow with the model.
"""
from __future__ import annotations

import threading

_get_ident = threading.get_ident

LOCALS = "_st, _dx, _dp, _da, _df, _dr, _dl, _dm"


class ThreadEntry:
    """The first call of a generated function: the direct calls' parts, and this thread's stream."""

    def __init__(self):
        self.calls: list = []
        self.execute: list = []
        self.handles: list = []
        self.args: list = []
        self.states: list = []
        self.limits: list = []
        self.measures: list = []
        self._tid = None
        self._stream = None

    def __call__(self) -> tuple:
        tid = _get_ident()
        if tid != self._tid:
            for call in self.calls:
                self._stream = call.on_thread()
            self._tid = tid
        return (self._stream, self.execute, self.handles, self.args, self.fail, self.states, self.limits,
                self.measures)

    def fail(self, i: int, status: int):
        self.calls[i].fail(status)

    def add(self, d) -> int:
        self.calls.append(d.call)
        self.execute.append(d.call.execute)
        self.handles.append(d.call.handle)
        self.args.append(d.call.args)
        self.states.append(d.state)
        self.limits.append(None if d.limit is None else float(d.limit))
        self.measures.append(d.measure)
        return len(self.calls) - 1


def direct_form(kernel, tensors: tuple, out):
    """The kernel's ``Direct`` for these fixed tensors, or None."""
    offer = getattr(kernel, "direct", None)
    return offer(tensors, out) if offer is not None else None


def direct_lines(d, entry: ThreadEntry, kname: str, args: str, target: str) -> list[str]:
    """The lines of one direct call (unindented; a nested line starts with four spaces);
    ``kname`` is the kernel's own name, called where the guard does not admit the direct call."""
    i = entry.add(d)
    call = f"if (_s := _dx[{i}](_dp[{i}], _st, {int(d.call.n)}, _da[{i}])): _df({i}, _s)"
    measure = [] if d.measure is None else [f"_dm[{i}](_dr[{i}], {target}, True)"]
    if d.limit is None:
        return [call] + measure
    sep = ", " if args else ""
    fallback = f"if not _dr[{i}].m < _dl[{i}]: {kname}({args}{sep}out={target})"
    if not measure:
        return [fallback, "el" + call]
    return [fallback, "else:", "    " + call, "    " + measure[0]]
