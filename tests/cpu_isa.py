"""What this CPU gives oneDNN. The kernel tests that check which implementation oneDNN chose
(its AVX-512 ``brg`` kernels, the post-op tables checked against them, bfloat16 primitives)
run where the CPU has AVX-512; on an AVX2-only CPU oneDNN has other implementations and no
bfloat16 ones, and those checks skip (the numbers the model gives are still checked)."""
from __future__ import annotations

import pytest
import torch

from fusegraph.runtime.backends.cpu.dnnl.compute import bfloat16_arithmetic

CAPABILITY = torch.backends.cpu.get_cpu_capability()
AVX512 = CAPABILITY.startswith("AVX512")
BF16_ARITHMETIC = bfloat16_arithmetic()

needs_avx512 = pytest.mark.skipif(not AVX512, reason=f"checks oneDNN's AVX-512 kernels; this CPU: {CAPABILITY}")
needs_bf16 = pytest.mark.skipif(not BF16_ARITHMETIC, reason=f"oneDNN has no bfloat16 kernels on this CPU ({CAPABILITY})")
