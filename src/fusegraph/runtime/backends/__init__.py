"""Backends: the device-specific kernel choices, lowering and artifact state (``protocol.py``).

``backend_for(device, config)`` gives the backend a model binds with: ``cpu/`` (oneDNN
kernels, script segments, prepacked weights, threading and host-memory policy) for CPU, the
portable backend (every op's own ATen kernel) elsewhere.
"""
from __future__ import annotations

from .protocol import Backend, Decline, Deferred, Lowered, resolved


def backend_for(device: str, keep_freed_memory: bool = True, segments: bool = True,
                exact: bool = True) -> Backend:
    """``exact``: NaN / Inf as ONNX says (``Config.fast_math`` off)."""
    if str(device).startswith("cpu"):
        from .cpu.backend import CpuBackend
        return CpuBackend(keep_freed_memory=keep_freed_memory, segments=segments, exact=exact)
    return Backend()


__all__ = ["Backend", "Decline", "Deferred", "Lowered", "backend_for", "resolved"]
