"""The dtype a convolution or product computes a stored dtype in, on this CPU.

float16 is always stored, not computed (no float16 arithmetic in these primitives): the
float32 primitive reads it through its staging buffer and rounds its result once. bfloat16 is
computed in bfloat16 where oneDNN has a kernel for it (AVX512-BF16, AMX, or AVX-512's
emulation); on a CPU without (AVX2 only) oneDNN has none, and ATen's own bfloat16 convolution
there is many times slower than float32 (benchmarks/RESULTS.md, "a CPU without bf16
arithmetic"), so bfloat16 is stored and computed as float16 is. The
values are the same bfloat16 values either way (products of two bfloat16 numbers are exact in
float32; only the accumulation order differs), and the result is rounded to bfloat16 once.
"""
from __future__ import annotations

import functools

import torch

from . import capi
from .memory import MemDesc
from .primitive import create


@functools.cache
def matmul_implementation(dtype: torch.dtype, dims: tuple[int, ...] = (16, 16)) -> str | None:
    """The implementation oneDNN picks on this CPU for a small product of two contiguous
    ``dtype`` operands of shape ``dims`` (a square, or a batch of squares), None where it has
    none (or oneDNN does not load)."""
    lib = capi.load()
    if lib is None:
        return None
    a = MemDesc.of(dims, dtype)
    try:
        prim = create("matmul", lambda pd: lib.matmul_primitive_desc_create(
            pd, lib.engine, a.handle, a.handle, None, a.handle, None))
    except capi.DnnlError:
        return None
    return prim.impl


def bfloat16_arithmetic() -> bool:
    """Whether oneDNN has a bfloat16 product for this CPU (a small matmul that is not its
    reference implementation)."""
    impl = matmul_implementation(torch.bfloat16)
    return impl is not None and not impl.startswith("ref")


def compute_dtype(stored: torch.dtype) -> torch.dtype:
    """The dtype a primitive over ``stored`` data computes in (see the module's docstring)."""
    if stored == torch.float16 or (stored == torch.bfloat16 and not bfloat16_arithmetic()):
        return torch.float32
    return stored
