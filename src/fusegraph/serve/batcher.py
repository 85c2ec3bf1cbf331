"""Dynamic batching: one queue per model, one worker thread per model instance.

A request is checked before it is queued (``tensors.check_inputs``), so a bad one can never
spoil a batch. A worker takes the oldest waiting request, then gathers requests whose inputs
have the same non-batch shapes and dtypes until the batch holds ``max_batch_size`` rows or
``max_queue_delay_ms`` has passed since the oldest arrived; it stacks them on the batch axis,
runs its instance, and splits the outputs back by each request's rows. Models without
batching take one request at a time. Requests past their deadline are dropped from the queue
with a 504, and requests whose client gave up (a cancelled future) are dropped too; neither
runs, and a batch left empty by them is given up instead of waiting out its window. A batch
runs with a ``CancelToken`` whose deadline is its last request's: a run past it stops at its
next kernel (or Loop iteration) and the model is free for the next batch at once (504).
``stop()`` refuses new requests, lets the workers finish everything already queued, and
joins them (the drain); ``abort()`` answers the queue 503 and stops the running batches.
The queue length is bounded (503 when full). A failed run is answered 400 when it raised a
typed error (the request asked for what the model cannot do), 500 only for a server fault.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..errors import FusegraphError, RunCancelled, RunDeadlineExceeded
from ..runtime.run_control import CancelToken
from .model import Instance, ServedModel
from .tensors import RequestError

log = logging.getLogger("fusegraph.serve")
ABORT_JOIN_S = 5.0     # how long stop() waits for workers whose runs it stopped


@dataclass
class Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    signature: tuple
    deadline: float
    enqueued: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class NullMetrics:
    def queued(self, model: str, seconds: float) -> None: ...
    def computed(self, model: str, seconds: float, batch: int) -> None: ...


class Batcher:
    def __init__(self, model: ServedModel, metrics=None):
        self.model = model
        self.metrics = metrics or NullMetrics()
        s = model.settings
        self.axis = model.batch_axis
        self.max_rows = s.max_batch_size if model.batch_axis is not None else 1
        self.delay = s.max_queue_delay_ms / 1000.0
        self.max_queue = s.max_queue_size
        self._queue: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running: dict[int, CancelToken] = {}    # instance index -> its batch's token
        self._threads = [threading.Thread(target=self._work, args=(inst,), daemon=True,
                                          name=f"fg-{model.name}-{inst.index}") for inst in model.instances]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def signature(self, inputs: dict[str, np.ndarray]) -> tuple:
        if self.axis is None:
            return ()
        return tuple((k, v.dtype.str, v.shape[:self.axis] + v.shape[self.axis + 1:]) for k, v in sorted(inputs.items()))

    def submit(self, inputs: dict[str, np.ndarray], rows: int, timeout: float) -> Future:
        item = Pending(inputs, rows, self.signature(inputs), time.monotonic() + timeout)
        with self._cond:
            if self._stopping:
                raise RequestError(f"model {self.model.name!r} is shutting down; retry on another server", 503)
            if len(self._queue) >= self.max_queue:
                raise RequestError(f"model {self.model.name!r}: {len(self._queue)} requests already wait "
                                   f"(max_queue_size); retry later", 503)
            self._queue.append(item)
            self._cond.notify()
        return item.future

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests, let the workers finish what is queued (up to ``timeout``), then
        stop whatever still runs (``abort``) and join the workers."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        end = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(None if end is None else max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            self.abort()
            for t in self._threads:
                t.join(ABORT_JOIN_S)

    def abort(self, reason: str = "the server is shutting down; retry on another server") -> None:
        """Answer every queued request 503 with ``reason``, and stop the running batches at their
        next kernel boundary (their requests are answered the same way)."""
        with self._cond:
            queued, self._queue = list(self._queue), deque()
            running = list(self._running.values())
        for item in queued:
            if not item.future.done() and not item.future.cancelled():
                item.future.set_exception(RequestError(f"model {self.model.name!r}: {reason}", 503))
        for token in running:
            token.cancel(reason)

    # -- workers ---------------------------------------------------------------------------
    def _pending(self, item: Pending, now: float) -> bool:
        """Whether ``item`` still wants an answer: False once cancelled (its client gave up)
        or past its deadline (then answered 504 here)."""
        if item.future.cancelled():
            return False
        if now > item.deadline:
            if not item.future.done():
                item.future.set_exception(RequestError(
                    f"model {self.model.name!r}: request timed out after waiting "
                    f"{now - item.enqueued:.3f} s in the queue", 504))
            return False
        return True

    def _take(self) -> list[Pending] | None:
        """The next batch: the oldest live request plus compatible ones, gathered until the
        batch is full or the oldest has waited ``max_queue_delay_ms``. A batch whose every
        request was cancelled or timed out while gathering is given up, not run."""
        with self._cond:
            while True:
                while not self._queue:
                    if self._stopping:
                        return None
                    self._cond.wait(0.5)
                first = self._queue.popleft()
                if not self._pending(first, time.monotonic()):
                    continue
                batch, window_end = [first], first.enqueued + self.delay
                while batch:
                    rows = sum(it.rows for it in batch)
                    i = 0
                    while i < len(self._queue) and rows < self.max_rows:
                        item = self._queue[i]
                        if item.signature == first.signature and rows + item.rows <= self.max_rows:
                            del self._queue[i]
                            if self._pending(item, time.monotonic()):
                                batch.append(item)
                                rows += item.rows
                        else:
                            i += 1
                    now = time.monotonic()
                    batch = [it for it in batch if self._pending(it, now)]
                    if not batch:
                        break
                    rows = sum(it.rows for it in batch)
                    if rows >= self.max_rows or now >= window_end or self._stopping:
                        if self._queue:
                            self._cond.notify()  # another worker may take what this batch left
                        return batch
                    self._cond.wait(min(window_end - now, 0.05))  # wake to see cancellations too

    def _refusal(self, exc: Exception, seconds: float) -> RequestError:
        """What the requests of a failed batch are answered: 504 when its run was stopped at
        the deadline, 503 when the server stopped it, 400 for a typed error (the request's data
        asked for what the model cannot do), 500 (logged) for anything else."""
        name = self.model.name
        if isinstance(exc, RunDeadlineExceeded):
            return RequestError(f"model {name!r}: request timed out; its run was stopped after {seconds:.3f} s", 504)
        if isinstance(exc, RunCancelled):
            return RequestError(f"model {name!r}: {exc.reason}", 503)
        if isinstance(exc, FusegraphError):
            return RequestError(f"model {name!r}: inference failed: {exc}", 400)
        log.exception("model run failed", extra={"model": name})
        return RequestError(f"model {name!r}: inference failed: {type(exc).__name__}", 500)

    def _work(self, instance: Instance) -> None:
        import torch
        torch.set_num_threads(self.model.threads)
        while True:
            batch = self._take()
            if batch is None:
                return
            self._run(instance, batch)

    def _run(self, instance: Instance, batch: list[Pending]) -> None:
        batch = [it for it in batch if it.future.set_running_or_notify_cancel()]
        if not batch:
            return
        start = time.monotonic()
        for item in batch:
            self.metrics.queued(self.model.name, start - item.enqueued)
        rows = sum(item.rows for item in batch)
        # the batch runs until its last request's deadline: past it nobody waits for the outputs
        token = CancelToken(max(0.0, max(it.deadline for it in batch) - start))
        with self._cond:
            self._running[instance.index] = token
        try:
            if len(batch) == 1:
                feeds = batch[0].inputs
            else:
                feeds = {k: np.concatenate([it.inputs[k] for it in batch], axis=self.axis) for k in batch[0].inputs}
            outputs = instance.run(feeds, rows, cancel=token)
        except Exception as exc:  # noqa: BLE001 - a failed run fails its batch, never the server
            error = self._refusal(exc, time.monotonic() - start)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            return
        finally:
            with self._cond:
                self._running.pop(instance.index, None)
        self.metrics.computed(self.model.name, time.monotonic() - start, rows)
        if len(batch) == 1:
            batch[0].future.set_result(outputs)
            return
        lead = (slice(None),) * self.axis
        offset = 0
        for item in batch:
            part = {k: v[lead + (slice(offset, offset + item.rows),)] for k, v in outputs.items()}
            offset += item.rows
            item.future.set_result(part)
