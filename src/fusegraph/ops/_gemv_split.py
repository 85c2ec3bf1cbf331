"""Two-way split of a matrix-vector product over two threads, robust to a busy machine.

MKL runs a single-row product (``[1, K] @ [K, N]``, every decoder step and every batch-1,
sequence-1 transformer call) on one thread, so a second core stays idle while the weights
stream from memory. ``split_gemv`` computes one half of the output columns on the calling
thread and hands the other half to one helper thread. The hand-off is claimed, not assigned:
when the caller finishes its half and the helper has not started the other (its core is busy,
or it is still waking), the caller computes it too. So a loaded machine costs a few
microseconds, never a scheduler tick (an OpenMP fork/join waits for every thread it forked).

On a machine whose other core is busy even a claimed hand-off loses (measured: 35-50 % slower
on 2 shared cores at load 4.7, 1.5-1.9x faster when a core is free), so ``Chooser`` keeps, per
call site, a moving average of both ways and runs the faster one, trying the other every
``EXPLORE`` calls: the kernel follows the machine's load instead of a fixed guess.

The helper runs in inference mode; each half is one torch call (GIL released) writing a
disjoint slice of the output. Used by ``LinearAct`` (``fused_transformer.py``).
"""
from __future__ import annotations

import queue
import threading
import time

import torch

_TASKS: "queue.SimpleQueue[_Task]" = queue.SimpleQueue()
_STARTED = threading.Lock()
_helper: threading.Thread | None = None


class _Task:
    __slots__ = ("fn", "args", "claim", "done", "error")

    def __init__(self, fn, args):
        self.fn, self.args, self.error = fn, args, None
        self.claim, self.done = threading.Lock(), threading.Lock()
        self.done.acquire()

    def run_if_unclaimed(self) -> None:
        if not self.claim.acquire(blocking=False):
            return                      # the caller took it back
        try:
            self.fn(*self.args)
        except BaseException as exc:    # re-raised on the calling thread
            self.error = exc
        finally:
            self.done.release()


def _loop() -> None:
    with torch.inference_mode():
        while True:
            _TASKS.get().run_if_unclaimed()


def _ensure_helper() -> None:
    global _helper
    if _helper is None:
        with _STARTED:
            if _helper is None:
                _helper = threading.Thread(target=_loop, name="fusegraph-gemv", daemon=True)
                _helper.start()


def split_gemv(first, second) -> None:
    """Run ``first()`` here and ``second()`` on the helper (or here, if it has not begun)."""
    _ensure_helper()
    task = _Task(second, ())
    _TASKS.put(task)
    first()
    if task.claim.acquire(blocking=False):
        second()
        return
    task.done.acquire()
    if task.error is not None:
        raise task.error


EXPLORE = 16


class Chooser:
    """Per call site: run ``whole()`` or ``split_gemv(first, second)``, whichever has been
    faster lately (exponential moving average of the wall time), exploring the other way
    every ``EXPLORE`` calls."""
    __slots__ = ("avg", "calls")

    def __init__(self):
        self.avg = [0.0, 0.0]     # seconds: whole, split (0: not measured yet)
        self.calls = 0

    def run(self, whole, first, second) -> None:
        self.calls += 1
        avg = self.avg
        if not avg[0] or not avg[1]:
            mode = 0 if not avg[0] else 1
        else:
            mode = 0 if avg[0] <= avg[1] else 1
            if self.calls % EXPLORE == 0:
                mode = 1 - mode
        t0 = time.perf_counter()
        if mode:
            split_gemv(first, second)
        else:
            whole()
        dt = time.perf_counter() - t0
        avg[mode] = dt if not avg[mode] else 0.8 * avg[mode] + 0.2 * dt
