"""How many intra-op threads a oneDNN primitive is made for.

oneDNN fixes a primitive's work partition, and so its thread count, when the primitive is made
(OpenMP build: it reads the calling thread's team size then). A small convolution or product
gains little from a second thread and pays a fork/join on every call, so it is made inside
``threads_for(True)``: one thread, with no thread-count change at run time (changing torch's
count around a call costs more than such kernels take). Thresholds: ``PARALLEL_MACS``
multiply-adds for convolutions, ``SERIAL_MACS`` for products, unless their weights have
``PARALLEL_WEIGHTS`` elements or more: a one-row product is bound by reading its weights, and
two cores read them faster than one (measured on inception_v1's 1024 x 1000 classifier in
bfloat16, alone and inside a run, its weights coming from memory: benchmarks/RESULTS.md,
"Figures moved out of docstrings"). The choice depends only on sizes, never on timing, so a
model's results are the same on every run. Nothing here decides what a kernel computes.
"""
from __future__ import annotations

from ...threads import intra_op_threads

SERIAL_MACS = 1 << 23
PARALLEL_WEIGHTS = 1 << 18
PARALLEL_MACS = 1 << 16


def threads_for(one_thread: bool):
    """Within the block, the thread count a kernel made there runs at (one, or as it is)."""
    return intra_op_threads(1 if one_thread else None)
