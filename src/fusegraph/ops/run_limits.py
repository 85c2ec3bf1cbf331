"""Run-time caps that kernels honour before they allocate (``NodeContext.limits``).

A kernel whose output size comes from run-time data (a ConstantOfShape of a fed shape, an
Expand / Tile / Range / Pad / Resize / OneHot whose sizes arrive with the feeds) cannot be
planned: its tensor is made at run time outside the arena. ``check_tensor`` refuses such a
tensor above ``RunLimits.max_tensor_bytes`` with a ``RunLimitExceeded`` naming the node and
the size, before anything is allocated (the shape arithmetic is done on Python integers,
so no overflow can hide a bomb). ``RunLimits.max_loop_iterations`` bounds the iterations of
one Loop call (``control_flow.py``). The runtime fills the limits from ``fg.Config``
(``max_run_bytes``, ``max_loop_iterations``); folding and inference build kernels with
``NO_LIMITS``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import RunLimitExceeded


@dataclass(frozen=True)
class RunLimits:
    max_tensor_bytes: int | None = None      # largest tensor made from run-time sizes (None: no cap)
    max_loop_iterations: int | None = None   # iterations of one Loop call (None: no cap)


NO_LIMITS = RunLimits()


def tensor_bytes(shape, dtype: torch.dtype) -> int:
    """Bytes of a tensor of ``shape`` (Python integers: no overflow) and torch ``dtype``."""
    return math.prod(int(d) for d in shape) * dtype.itemsize


def check_tensor(limits: RunLimits, node, shape, dtype: torch.dtype, what: str = "a tensor") -> None:
    """Refuse (``RunLimitExceeded``) to make a tensor of ``shape`` and ``dtype`` at run time
    when it is larger than ``limits.max_tensor_bytes``."""
    cap = limits.max_tensor_bytes
    if cap is None:
        return
    size = tensor_bytes(shape, dtype)
    if size > cap:
        raise RunLimitExceeded(
            f"node {node.name!r} ({node.op_type}) would make {what} of shape {list(int(d) for d in shape)} "
            f"({size} bytes) from run-time data, over Config.max_run_bytes ({cap} bytes)",
            node=node.name, requested=size, limit=cap)


def check_iterations(limits: RunLimits, node, iteration: int) -> None:
    """Refuse a Loop's iteration ``iteration`` (0-based) past ``limits.max_loop_iterations``."""
    cap = limits.max_loop_iterations
    if cap is not None and iteration >= cap:
        raise RunLimitExceeded(f"node {node.name!r} ({node.op_type}) would run more than {cap} iterations, "
                               f"over Config.max_loop_iterations", node=node.name, requested=iteration + 1,
                               limit=cap)
