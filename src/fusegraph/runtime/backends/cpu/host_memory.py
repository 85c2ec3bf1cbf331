"""Host (CPU) memory reuse across runs: glibc malloc told to keep freed memory.

A kernel that allocates its result (the portable kernels of a model with dynamic shapes,
which has no arena) asks malloc for the same sizes on every run. glibc serves requests over
its mmap threshold with fresh ``mmap`` pages and hands the top of its heap back to the OS when
more than its trim threshold is free, so such a run faults its pages in again every time
(inception_v1 on per-node kernels: ~2000 minor page faults per run, a fifth of its latency).
``keep_freed_memory()`` raises both thresholds once per process (``mallopt``): allocations up
to 32 MiB come from the heap and freed memory stays there for the next run. It is
process-wide — the host program's allocations follow the same thresholds — and keeps a
compile's freed memory resident, so it runs only when ``Config(keep_freed_memory=True)``
asks (the CPU backend's planned kernels allocate nothing per run).
No-op (returns False) off glibc. ``release_free_memory()`` (``malloc_trim``) hands what is
free now back to the OS, after binding, whose one-off work (the layout probe, packing the
weights) frees more than a run reuses.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20       # glibc's largest allowed value on 64-bit hosts
TRIM_THRESHOLD = 512 << 20
_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Raise malloc's mmap and trim thresholds (once); True when glibc accepted both."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            libc = _libc()
            mallopt = libc.mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        except (OSError, AttributeError):   # not glibc (musl has no mallopt thresholds)
            ok = False
    _done.append(ok)
    return ok


def release_free_memory() -> bool:
    """Return malloc's free memory to the OS now (glibc ``malloc_trim(0)``); False off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _libc():
    """glibc, by its soname (``ctypes.util.find_library`` would run ``ldconfig`` in a subprocess
    on every call)."""
    return ctypes.CDLL("libc.so.6")


def freed_memory_kept() -> bool:
    """Whether ``keep_freed_memory()`` has taken effect in this process."""
    return bool(_done and _done[0])
