"""Backends: the device-specific kernel choices and artifact state (``protocol.py``), and the
questions the layers above may ask about a device without importing its backend by path.

- ``backend_for(device, ...)``: the backend a model binds with: ``cpu/`` (oneDNN primitives
  writing into the arena with packed weights, host-memory policy) for CPU, the portable
  backend (every op's own ATen kernel) elsewhere;
- ``weight_share(device)``: a store of packed weights that several bindings of one model share
  (None where the backend packs nothing);
- ``bf16_arithmetic(device)``: why reduced precision cannot pay on a device (None where it can);
- ``stored_plain(value, forms, where)``: a weight an artifact holds only in a backend's packed
  form, read back plain without that backend's kernels (a model loaded for another device).
"""
from __future__ import annotations

from .protocol import Backend, Decline


def backend_for(device: str, keep_freed_memory: bool = False, exact: bool = True,
                kernels: str = "auto", shared_forms=None) -> Backend:
    """``exact``: NaN / Inf as ONNX says (``Config.fast_math`` off); ``kernels``:
    ``Config.cpu_kernels`` (auto | onednn | portable); ``shared_forms``: what
    ``weight_share(device)`` gave, shared with other bindings of the same model."""
    if str(device).startswith("cpu"):
        from .cpu.backend import CpuBackend
        return CpuBackend(keep_freed_memory=keep_freed_memory, exact=exact, kernels=kernels,
                          shared_forms=shared_forms)
    return Backend()


def weight_share(device: str):
    """A packed-weight store several bindings of one model share, or None (no packing there)."""
    if str(device).startswith("cpu"):
        from .cpu.dnnl.weights import SharedForms
        return SharedForms()
    return None


def bf16_declined(device: str) -> str | None:
    """Why bfloat16 cannot pay on ``device`` ("cpu" / "cuda"): None where it has bf16
    arithmetic; on a CPU whose oneDNN has no bf16 product (AVX2 only), bf16 runs as float32 over
    bf16 storage, slower than float32."""
    import torch
    if str(device).startswith("cuda"):
        return None if torch.cuda.is_bf16_supported() else "this GPU has no bf16 arithmetic"
    from .cpu.dnnl.compute import bfloat16_arithmetic
    if bfloat16_arithmetic():
        return None
    return (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no bf16 arithmetic: bf16 would run "
            "as float32 over bf16 storage, slower than float32")


def int8_declined(device: str) -> str | None:
    """Why int8 products cannot pay on ``device``: None on a CPU whose oneDNN sums uint8 x int8
    products exactly (VNNI / AMX: ``cpu/dnnl/int8_support.int8_exact``); elsewhere the int8 ops
    run as float32 (oneDNN's float32 kernels over dequantised values, ``cpu/dnnl/int8_float.py``,
    or their reference form), no faster than float32."""
    import torch
    if str(device).startswith("cuda"):
        return "the int8 kernels are CPU kernels (oneDNN): a GPU runs the int8 ops' reference form"
    from .cpu.dnnl import available
    from .cpu.dnnl.int8_support import int8_exact
    if available() and int8_exact():
        return None
    return (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no exact int8 dot products (VNNI / AMX) "
            "or oneDNN does not load: the int8 ops would run as float32 arithmetic on dequantised values")


def stored_plain(value, forms: list, where: str):
    """The plain tensor of ``value`` (a constant stored only packed: its graph placeholder) from
    its stored forms, with no kernel of the backend that packed them (``ArtifactError`` for a
    malformed form)."""
    from .cpu.backend import stored_plain as cpu_stored_plain   # the only backend that packs
    return cpu_stored_plain(value, forms, where)


__all__ = ["Backend", "Decline", "backend_for", "bf16_declined", "int8_declined", "stored_plain", "weight_share"]
