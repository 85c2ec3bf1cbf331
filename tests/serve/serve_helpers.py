"""Helpers of the server tests: a ``fusegraph serve`` subprocess on loopback, random feeds,
bounded waiting. Every wait here is bounded in time."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

# Every model the test server holds: the nine light models and the BERT / GPT-2 exports.
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512", "bert", "gpt2"]
BATCHED = "max_batch_size = 4\nmax_queue_delay_ms = 300\nthreads = 1\n"


class ServerProcess:
    """``python -m fusegraph.cli serve REPO --port 0 --grpc-port 0 ...`` and its log lines."""

    def __init__(self, repo: Path, *args: str, start_timeout: float = 120.0):
        cmd = [sys.executable, "-m", "fusegraph.cli", "serve", str(repo), "--port", "0", "--grpc-port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[dict] = []
        self.raw: list[str] = []
        self._serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._serving.wait(start_timeout) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.raw[-40:]))
        line = next(d for d in self.lines if d.get("msg") == "serving")
        self.http = f"127.0.0.1:{line['http_port']}"
        self.grpc = f"127.0.0.1:{line['grpc_port']}"

    def _read(self):
        for text in self.proc.stderr:
            self.raw.append(text)
            try:
                data = json.loads(text)
            except ValueError:
                continue
            self.lines.append(data)
            if data.get("msg") == "serving":
                self._serving.set()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def feeds_for(model, seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    """Random inputs for ``model``: symbolic dims 1 (batch) or 16 (sequence), ids below 1000."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in model.inputs:
        shape = [d if isinstance(d, int) else (batch if i == 0 else 16) for i, d in enumerate(spec.shape)]
        dtype = spec.dtype.to_numpy()
        if np.issubdtype(dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones(shape, dtype)
        else:
            feeds[spec.name] = rng.integers(0, 1000, shape).astype(dtype)
    return feeds


def wait_until(predicate, timeout: float = 20.0, step: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False
