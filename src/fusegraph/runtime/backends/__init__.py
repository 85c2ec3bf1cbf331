"""Backends: the device-specific kernel choices and artifact state (``protocol.py``).

``backend_for(device, ...)`` gives the backend a model binds with: ``cpu/`` (oneDNN
primitives writing into the arena with packed weights, host-memory policy) for CPU, the
portable backend (every op's own ATen kernel) elsewhere.
"""
from __future__ import annotations

from .protocol import Backend, Decline


def backend_for(device: str, keep_freed_memory: bool = False, exact: bool = True,
                kernels: str = "auto", shared_forms=None) -> Backend:
    """``exact``: NaN / Inf as ONNX says (``Config.fast_math`` off); ``kernels``:
    ``Config.cpu_kernels`` (auto | onednn | portable); ``shared_forms``: packed weights shared
    with other compiles of the same model (CPU: ``cpu/dnnl/weights.SharedForms``)."""
    if str(device).startswith("cpu"):
        from .cpu.backend import CpuBackend
        return CpuBackend(keep_freed_memory=keep_freed_memory, exact=exact, kernels=kernels,
                          shared_forms=shared_forms)
    return Backend()


__all__ = ["Backend", "Decline", "backend_for"]
