"""The activation arena: one ``torch.empty(arena_bytes, dtype=uint8)`` per compiled model, and
typed views of it, one per planned value, made once at compile time.

A view is ``arena[off:off+size].view(dtype).view(shape)``: contiguous (channels-last strides
for a 3-D or 4-D value whose ``layout`` is ``nhwc``), at the planner's offset (a multiple of 64
bytes). The generated run function holds these views as globals,
so a kernel with ``out=`` writes straight into its slot and a run allocates nothing for it.
``contains`` tells whether a tensor's memory lies in the arena (output copies, alias guards
and the allocation check of the tests use it). This file plans nothing: offsets come from
``plan/``.
"""
from __future__ import annotations

import torch

from ..ir import Value


class Arena:
    def __init__(self, nbytes: int, device: str | torch.device = "cpu"):
        self.nbytes = int(nbytes)
        self.tensor = torch.empty(max(self.nbytes, 1), dtype=torch.uint8, device=device)
        self.lo = self.tensor.data_ptr()
        self.hi = self.lo + self.nbytes

    def view(self, offset: int, size: int, value: Value, strides: tuple[int, ...] | None = None) -> torch.Tensor:
        """The slot ``[offset, offset + size)`` seen as ``value``'s dtype and static shape;
        ``strides`` (dense ones, as the value's kernel lays out its result: ``layout_probe.py``)
        take precedence over ``value.layout``."""
        dtype = value.dtype.to_torch()
        shape = tuple(int(d) for d in value.shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + size > self.nbytes or offset % itemsize or size % itemsize:
            raise ValueError(f"arena slot [{offset}, {offset + size}) of %{value.name} does not fit "
                             f"an arena of {self.nbytes} bytes as {value.dtype.name}")
        flat = self.tensor[offset:offset + size].view(dtype)
        if strides is not None:
            return flat.as_strided(shape, strides)
        if value.layout == "nhwc" and len(shape) in (3, 4):   # channels-last strides (passes/layout.py)
            n, c, *spatial = shape
            return flat.view(n, *spatial, c).movedim(-1, 1)
        return flat.view(shape)

    def contains(self, t: torch.Tensor) -> bool:
        return self.lo <= t.data_ptr() < self.hi if t.numel() else False

    def __repr__(self) -> str:
        return f"Arena({self.nbytes} bytes on {self.tensor.device})"
