"""Buffers for packed weights in 2 MiB pages, where the kernel gives them.

A product streams its weight from memory on every call (a decoder's one-row steps, the int8
kernels' weights between layers that evict each other). On 4 KiB pages each 4 KiB of weight
is a TLB miss and a page walk, and the hardware prefetchers stop at every page boundary;
Linux backs an anonymous range with 2 MiB pages where it is asked to (``MADV_HUGEPAGE``, with
transparent huge pages in ``madvise`` or ``always`` mode). ``HugeBuffers.empty(nbytes)`` gives
a uint8 tensor inside such a range: one ``mmap`` of at least ``SLAB_BYTES`` (2 MiB aligned)
is cut into consecutive buffers, each 64-byte aligned, so a model's weights share their huge
pages instead of each rounding up to one. A slab is unmapped when the last tensor cut from
it is freed (each holds the mapping). Below ``MIN_BYTES`` a request, and every request where
the kernel has no transparent huge pages (``never``, or not Linux), is a plain
``torch.empty``. The trade: a slab's last huge page is resident once touched, whole (at most
2 MiB more private memory per store than the weights' bytes).
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import threading

import torch

HUGE_PAGE = 2 << 20
SLAB_BYTES = 32 << 20          # the smallest mapping cut into buffers
MIN_BYTES = 1 << 20            # smaller buffers: plain allocations (a few pages' TLB entries)
ALIGN = 64
THP_MODES = "/sys/kernel/mm/transparent_hugepage/enabled"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Linux with transparent huge pages in ``always`` or ``madvise`` mode, and ``madvise``."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(THP_MODES) as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


class HugeBuffers:
    """Consecutive uint8 buffers cut from 2 MiB-page mappings (see the module docstring)."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = available() if enabled is None else enabled
        self._slab: torch.Tensor | None = None    # the current mapping's bytes, 2 MiB aligned
        self._used = 0
        self._lock = threading.Lock()

    def takes(self, nbytes: int) -> bool:
        """Whether a buffer of ``nbytes`` would be cut from 2 MiB pages."""
        return self.enabled and nbytes >= MIN_BYTES

    def empty(self, nbytes: int) -> torch.Tensor:
        nbytes = max(int(nbytes), 1)
        if not self.takes(nbytes):
            with torch.inference_mode(False):
                return torch.empty(nbytes, dtype=torch.uint8)
        with self._lock, torch.inference_mode(False):
            start = -(-self._used // ALIGN) * ALIGN
            if self._slab is None or start + nbytes > self._slab.numel():
                self._slab, start = _mapping(max(SLAB_BYTES, nbytes)), 0
            self._used = start + nbytes
            return self._slab[start:start + nbytes]

    def give_back(self, t: torch.Tensor) -> None:
        """Reuse the bytes of ``t`` for the next buffer when it is the last one cut (a form a
        binding made and dropped); anything else stays where it is until its slab is freed."""
        with self._lock:
            slab = self._slab
            if slab is None or t.numel() == 0 or t.untyped_storage().data_ptr() != slab.untyped_storage().data_ptr():
                return
            start = t.data_ptr() - slab.data_ptr()
            if 0 <= start and start + t.numel() == self._used:
                self._used = start


def _mapping(nbytes: int) -> torch.Tensor:
    """``nbytes`` (rounded up to 2 MiB) of a fresh anonymous mapping, 2 MiB aligned and advised
    ``MADV_HUGEPAGE``; the tensor (and every slice of it) keeps the mapping alive."""
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    mm = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    offset = -base % HUGE_PAGE
    mm.madvise(mmap.MADV_HUGEPAGE, offset, size)
    with torch.inference_mode(False):
        return torch.frombuffer(mm, dtype=torch.uint8, count=size, offset=offset)
