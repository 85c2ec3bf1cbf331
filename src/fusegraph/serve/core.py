"""The protocol-independent core of the server: models, batchers, metrics, one ``infer``.

The HTTP and gRPC front ends decode a request into numpy arrays, then call
``Core.infer(model, arrays, outputs, protocol)`` which looks the model up (404), checks the
inputs (400), queues them on the model's batcher (503 when full or draining), waits up to the
request timeout (504: a run past it is stopped, ``batcher.py``) and returns the requested
outputs (400 for an unknown one). It counts every answer in the metrics and keeps the
in-flight gauge. Shutdown: once it begins new requests get 503; at the end of the drain window
``abort`` answers what is still queued or running with 503 (runs stopped at their next kernel).
No socket code lives here.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from .batcher import Batcher
from .metrics import Metrics
from .model import ServedModel
from .repository import ModelEntry
from .settings import ServerLimits
from .tensors import RequestError, check_inputs

log = logging.getLogger("fusegraph.serve")
SHUTTING_DOWN = "the server is shutting down; retry on another server"


class Core:
    def __init__(self, entries: list[ModelEntry], limits: ServerLimits | None = None):
        self.limits = limits or ServerLimits()
        self.metrics = Metrics()
        self.models: dict[str, ServedModel] = {}
        self.batchers: dict[str, Batcher] = {}
        self.draining = False
        self.shutting_down = False  # set on SIGTERM: readiness goes false before the drain
        self._on_close: list = []
        for entry in entries:
            t0 = time.perf_counter()
            model = ServedModel(entry.name, entry.path, entry.settings)
            if entry.settings.warmup:
                for inst in model.instances:
                    inst.warmup()
            self.models[entry.name] = model
            self.batchers[entry.name] = Batcher(model, self.metrics)
            log.info("model loaded", extra={"model": entry.name, "path": str(entry.path),
                                            "instances": model.instance_count, "threads": model.threads,
                                            "max_batch_size": entry.settings.max_batch_size if model.batch_axis is not None else 0,
                                            "seconds": round(time.perf_counter() - t0, 3)})
        for batcher in self.batchers.values():
            batcher.start()
        for model in self.models.values():
            model.ready.set()

    @property
    def ready(self) -> bool:
        return not (self.draining or self.shutting_down) and all(m.ready.is_set() for m in self.models.values())

    def model(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise RequestError(f"unknown model {name!r}; this server has " +
                               (", ".join(repr(n) for n in self.models) or "no models"), 404)
        return model

    def check_open(self, name: str) -> None:
        """A request arriving once shutdown began is refused (503): the drain only finishes what
        was accepted before."""
        if self.shutting_down or self.draining:
            raise RequestError(f"model {name!r}: {SHUTTING_DOWN}", 503)

    def on_close(self, fn) -> None:
        """Call ``fn()`` when the core closes (a front end's worker pool, say)."""
        self._on_close.append(fn)

    def abort(self, reason: str = SHUTTING_DOWN) -> None:
        """End of the drain window: every queued request is answered 503 with ``reason`` and every
        running batch is stopped at its next kernel (its requests answered the same way), so no
        request is left for the HTTP server to cut off without an answer."""
        log.info("drain window over: stopping what still runs", extra={"reason": reason})
        for batcher in self.batchers.values():
            batcher.abort(reason)

    def check_version(self, model: ServedModel, version: str) -> None:
        if version not in ("", "1"):
            raise RequestError(f"model {model.name!r} has version 1 only, got version {version!r}", 404)

    def submit(self, name: str, arrays: dict[str, np.ndarray], timeout: float | None = None) -> Future:
        self.check_open(name)
        model = self.model(name)
        rows = check_inputs(name, model.inputs, arrays, model.batch_axis, model.settings.max_batch_size)
        return self.batchers[name].submit(arrays, rows, self.timeout(timeout))

    def timeout(self, client_s: float | None) -> float:
        limit = self.limits.timeout_s
        return limit if client_s is None else max(0.0, min(limit, client_s))

    def select(self, model: ServedModel, outputs: dict[str, np.ndarray], requested: list[str] | None):
        if not requested:
            return outputs
        missing = [n for n in requested if n not in outputs]
        if missing:
            raise RequestError(f"model {model.name!r} has no output {missing[0]!r}; its outputs are "
                               + ", ".join(repr(s.name) for s in model.outputs))
        return {n: outputs[n] for n in requested}

    def infer(self, name: str, arrays: dict[str, np.ndarray], requested: list[str] | None = None,
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Blocking inference (the gRPC front end's threads call this)."""
        model = self.model(name)
        if requested:
            self.select(model, {s.name: None for s in model.outputs}, requested)
        future = self.submit(name, arrays, timeout)
        try:
            outputs = future.result(timeout=self.timeout(timeout))
        except FutureTimeout:
            future.cancel()
            raise RequestError(f"model {name!r}: request timed out after {self.timeout(timeout):.3f} s", 504) from None
        return self.select(model, outputs, requested)

    def drain(self) -> None:
        """Refuse new requests and finish the queued ones (SIGTERM)."""
        if self.draining:
            return
        self.draining = True
        log.info("draining", extra={"queued": sum(len(b._queue) for b in self.batchers.values())})
        for batcher in self.batchers.values():
            batcher.stop(self.limits.drain_s)

    def close(self) -> None:
        self.drain()
        for model in self.models.values():
            model.close()
        for fn in self._on_close:
            fn()
