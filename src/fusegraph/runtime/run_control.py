"""Stopping a run from outside: cancel tokens, deadlines, and the flag the generated code reads.

A run stops only between kernels. The generated run function reads one flag before each
kernel call (``if _RC.stop: _RC.stopped()``; ``_RC`` is the executor's ``RunControl``), and a
control-flow body runner reads it before each Loop / Scan iteration (``subgraph.py``); a
kernel already running finishes first. ``CancelToken`` is what a caller holds, like
onnxruntime's ``RunOptions.terminate``: ``cancel()`` from any thread stops every run the token
was given to (and any run given it later: a token stays cancelled), and a token made with a
``timeout`` cancels itself when that passes. One watchdog thread per process holds the
deadlines of all live tokens, so a run with a deadline costs no thread of its own and the
hot path no clock read. A stopped run raises ``RunCancelled`` (``RunDeadlineExceeded`` when
its deadline passed) naming the node it stopped before; the model stays ready for its next
run (the arena is rewritten by every run, nothing half-made is kept).
"""
from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
import weakref

from ..errors import RunCancelled, RunDeadlineExceeded, UsageError

DEADLINE = "deadline"


class CancelToken:
    """Cancels the runs it is given to: ``model.run(feeds, cancel=token)``; ``token.cancel()``
    from any thread. ``CancelToken(timeout=s)`` also cancels itself ``s`` seconds after it
    was made (``RunDeadlineExceeded``). Thread-safe; one token may serve many runs."""

    __slots__ = ("_lock", "_reason", "_controls", "deadline", "timeout", "__weakref__")

    def __init__(self, timeout: float | None = None):
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or math.isnan(timeout) or timeout < 0):
            raise UsageError(f"a run's timeout must be a number of seconds >= 0 (or None), got {timeout!r}")
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._controls: list[RunControl] = []
        self.timeout = None if timeout is None or math.isinf(timeout) else float(timeout)
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        if self.deadline is not None:
            if self.timeout == 0:
                self._reason = DEADLINE
            else:
                _watchdog().add(self)

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """None while not cancelled; ``"deadline"`` when its timeout passed; else the reason
        given to ``cancel``."""
        return self._reason

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline; 0 once passed)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Stop every run this token is given to at its next kernel boundary."""
        self._fire(str(reason) or "cancelled")

    def cancel_at_deadline(self) -> None:
        """What the watchdog does when the deadline passes (a run that finds it passed first
        does it itself)."""
        self._fire(DEADLINE)

    def _fire(self, reason: str) -> None:
        with self._lock:       # under the lock: a run that detached is never stopped by it
            if self._reason is None:
                self._reason = reason
            for control in self._controls:
                control.stop = True

    def error(self, model: str, where: str = "") -> RunCancelled:
        """The exception a run stopped by this token raises."""
        at = f" {where}" if where else ""
        if self._reason == DEADLINE:
            return RunDeadlineExceeded(f"{model}: run stopped{at}: its deadline of {self.timeout:.3f} s passed",
                                       reason=DEADLINE)
        return RunCancelled(f"{model}: run stopped{at}: {self._reason}", reason=self._reason or "cancelled")

    def attach(self, control: "RunControl") -> None:
        with self._lock:
            self._controls.append(control)
            if self._reason is not None:
                control.stop = True

    def detach(self, control: "RunControl") -> None:
        with self._lock:
            try:
                self._controls.remove(control)
            except ValueError:
                pass

    def __repr__(self) -> str:
        state = f"cancelled: {self._reason}" if self._reason else "live"
        left = "" if self.deadline is None else f", {self.remaining():.3f} s left"
        return f"CancelToken({state}{left})"


class RunControl:
    """One executor's stop flag and the tokens of its current run (runs of one executor are
    serialised, so one control serves them all). ``stop`` is read by the generated code."""

    __slots__ = ("stop", "tokens", "model")

    def __init__(self, model: str):
        self.stop = False
        self.tokens: tuple[CancelToken, ...] = ()
        self.model = model

    def start(self, tokens: tuple[CancelToken, ...]) -> None:
        """Arm for a run (under the executor's run lock)."""
        self.stop = False
        self.tokens = tokens
        for t in tokens:
            if t.deadline is not None and t.remaining() <= 0:
                t.cancel_at_deadline()
            t.attach(self)

    def finish(self) -> None:
        for t in self.tokens:
            t.detach(self)
        self.tokens = ()
        self.stop = False

    def stopped(self, where: str = "") -> None:
        """Raise the stopping token's error (the generated code calls this when ``stop``)."""
        for t in self.tokens:
            if t.cancelled:
                raise t.error(self.model, where)
        self.stop = False          # no token of this run asked for it: go on


class _Watchdog:
    """One daemon thread that cancels tokens at their deadlines (a heap; a token that is
    gone is skipped when its deadline comes)."""

    def __init__(self):
        self._heap: list[tuple[float, int, weakref.ref]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, token: CancelToken) -> None:
        with self._cond:
            heapq.heappush(self._heap, (token.deadline, next(self._seq), weakref.ref(token)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="fusegraph-deadlines", daemon=True)
                self._thread.start()
            if self._heap[0][2]() is token:
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, ref = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            token = ref()
            if token is not None:
                token.cancel_at_deadline()


_WATCHDOG: _Watchdog | None = None
_WATCHDOG_LOCK = threading.Lock()


def _watchdog() -> _Watchdog:
    global _WATCHDOG
    if _WATCHDOG is None:
        with _WATCHDOG_LOCK:
            if _WATCHDOG is None:
                _WATCHDOG = _Watchdog()
    return _WATCHDOG


def _forget_watchdog() -> None:   # a forked child has no watchdog thread: it makes its own
    global _WATCHDOG
    _WATCHDOG = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watchdog)


def tokens_for(timeout: float | None, cancel: CancelToken | None) -> tuple[CancelToken, ...]:
    """The tokens a run with ``timeout`` (seconds) and ``cancel`` observes."""
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise UsageError(f"cancel must be a fusegraph.CancelToken, got {type(cancel).__name__}")
    tokens = () if cancel is None else (cancel,)
    if timeout is not None:
        tokens += (CancelToken(timeout),)
    return tokens
