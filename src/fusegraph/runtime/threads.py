"""The intra-op thread count a model compiles, binds and runs at, scoped to those calls.

torch's intra-op thread count is process-wide state that belongs to the caller. A model with
``Config.threads`` set runs (and binds its kernels) at that count inside ``intra_op_threads``
and puts the caller's count back afterwards, so compiling, loading or running a model never
changes what the rest of the process sees. ``config.machine_cores()`` bounds every thread count.
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def intra_op_threads(threads: int | None):
    """Within the block, torch runs at ``threads`` intra-op threads (None: as it is). The
    count found on entry is back on exit, also when the block changed it (a hybrid stream
    plan's wide nodes do) or raised."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
