"""Intra-op threading policy: which kernels run on one thread.

torch's CPU kernels (and oneDNN / MKL under them) split work over the intra-op OpenMP team
with a static partition, so every parallel region is a fork/join: a few microseconds on an
idle machine, and a whole scheduler tick (several ms, measured on 2 shared cores) whenever
the other core is busy — the partner thread's share waits until it is scheduled again.
Small kernels gain little from a second thread and risk that stall on every call, so they
run on one thread: ``serial_if`` per call (the size is known only at run time), ``serial``
for a kernel whose size is fixed at bind time. The choice depends only on sizes, never on
timing, so a model's results are the same on every run.

Running a kernel on one thread is not free either: while the team's partner thread has no
work it stops spinning and sleeps, and the next parallel region must wake it, so a graph
that alternates long serial stretches with parallel kernels loses more than it saves
(squeezenet at 2 threads, load 1.3-1.5: 16-24 ms with convolutions under 16M multiply-adds
serial, 6.7-8.7 ms under 1M or all parallel; benchmarks/RESULTS.md). Thresholds therefore
stay low: ``SERIAL_BELOW`` elements for elementwise work (torch's VML unary kernels fork at
2048 elements); products and convolutions set their multiply-add thresholds next to their
kernels. Nothing here decides what a kernel computes; ops choose their kernels, this says on
how many threads. Ops say how much work a call is (``kernel.work(*args)``: elements, or
multiply-adds when ``kernel.work_kind == "macs"``); ``with_policy`` reads it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

SERIAL_BELOW = 1 << 15
# A product of fewer multiply-adds runs on one intra-op thread: a one-row product is
# memory-bound and MKL does not split it, while the fork/join costs a scheduler tick whenever
# that thread's core is busy.
SERIAL_MACS = 1 << 23
# A convolution of fewer multiply-adds (a few us of work) runs on one thread: a fork/join is
# most of its time (benchmarks/RESULTS.md, "Convolution threading threshold").
PARALLEL_MACS = 1 << 16
THRESHOLDS = {"elements": SERIAL_BELOW, "macs": SERIAL_MACS, "conv_macs": PARALLEL_MACS}
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads


def serial_if(small: bool, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, on one intra-op thread when ``small``."""
    n = _get_threads()
    if n == 1 or not small:
        return fn(*args, **kwargs)
    _set_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        _set_threads(n)


def serial(fn: Callable) -> Callable:
    """``fn`` made to run on one intra-op thread (keeps its ``writes_out`` mark)."""
    @functools.wraps(fn)
    def on_one_thread(*args, **kwargs):
        return serial_if(True, fn, *args, **kwargs)
    if hasattr(fn, "writes_out"):
        on_one_thread.writes_out = fn.writes_out
    return on_one_thread


@contextlib.contextmanager
def threads_for(one_thread: bool):
    """Within the block, the thread count a kernel built there runs at (``serial`` or not)."""
    n = _get_threads()
    if not one_thread or n == 1:
        yield
        return
    _set_threads(1)
    try:
        yield
    finally:
        _set_threads(n)


def with_policy(kernel: Callable) -> Callable:
    """``kernel`` run on one thread whenever its call's work (``kernel.work``) is under the
    threshold for its kind; a kernel that states no work is returned as it is."""
    work = getattr(kernel, "work", None)
    if work is None:
        return kernel
    below = THRESHOLDS[getattr(kernel, "work_kind", "elements")]
    if isinstance(work, int):
        return serial(kernel) if work < below else kernel

    @functools.wraps(kernel)
    def sized(*args, **kwargs):
        return serial_if(work(*args, **kwargs) < below, kernel, *args, **kwargs)
    if hasattr(kernel, "writes_out"):
        sized.writes_out = kernel.writes_out
    return sized
