"""Workspace memory the CPU backend's kernels share: one buffer per thread that runs them, as
large as the largest any bound kernel asked for (``need``, at bind time, or ``at_least`` at
run time for shapes known only then), made at its first use and kept for the model's life. A model's runs are serialised on its lock and each stream
worker is one thread, so no two kernels use a thread's buffer at once: planned once,
allocated once per thread, never per run.
"""
from __future__ import annotations

import threading

import torch


class Workspace:
    def __init__(self):
        self.bytes = 0
        self._local = threading.local()

    def need(self, nbytes: int) -> None:
        self.bytes = max(self.bytes, int(nbytes))

    def at_least(self, nbytes: int) -> torch.Tensor:
        """This thread's buffer, grown to ``nbytes`` first if it is smaller (a kernel whose
        shapes are known only at run time: it grows a few times, then never)."""
        self.need(nbytes)
        return self.get()

    def get(self) -> torch.Tensor:
        """This thread's buffer (uint8, ``bytes`` long)."""
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < self.bytes:
            with torch.inference_mode(False):
                buf = self._local.buf = torch.empty(max(self.bytes, 1), dtype=torch.uint8)
        return buf
