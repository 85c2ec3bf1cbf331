"""Host (CPU) memory across runs: glibc malloc told to keep freed memory, or to give it back.

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

A model with symbolic input dims allocates per run what its planned memory does not hold
(outputs, ATen temporaries, sgemm's packing buffers), at sizes that change with the shape:
malloc keeps the freed chunks, fragmented, and the process's private memory creeps up over
traffic of many lengths. ``GrowthRelease.after_run()`` releases the free memory once the
process's private resident bytes have grown by ``RELEASE_GROWTH`` since its last release
(one read of ``/proc/self/statm``, kept open, a run; a release costs about a millisecond and returns
what no live allocation holds, the host program's freed memory included). Not where
``keep_freed_memory`` asked for the opposite.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20       # glibc's largest allowed value on 64-bit hosts
TRIM_THRESHOLD = 512 << 20
_done: list[bool] = []
RELEASE_GROWTH = 16 << 20       # private resident bytes grown since the last release that trigger one
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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


_STATM: list = []                # [(pid, descriptor of its /proc/self/statm)]: opened once per process


def private_resident_bytes() -> int | None:
    """The process's resident bytes not backed by a file or shared memory (``/proc/self/statm``:
    resident minus shared pages), or None where there is no such file. The file stays open and
    is read again at offset 0 (one system call a run, not three); a forked child, whose
    descriptor would still read its parent, opens its own."""
    try:
        pid = os.getpid()
        if not _STATM or _STATM[0][0] != pid:
            if _STATM:                  # the parent's, inherited: this process's copy of it closed
                with contextlib.suppress(OSError):
                    os.close(_STATM[0][1])
            _STATM[:] = [(pid, os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))]
        fields = os.pread(_STATM[0][1], 128, 0).split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class GrowthRelease:
    """Releases malloc's free memory after a run once private memory grew by ``RELEASE_GROWTH``
    since the last release (or since the first run)."""

    def __init__(self, growth: int = RELEASE_GROWTH):
        self.growth = growth
        self.base: int | None = None
        self.releases = 0

    def after_run(self) -> None:
        now = private_resident_bytes()
        if now is None:
            return
        if self.base is None or now < self.base:
            self.base = now
            return
        if now - self.base > self.growth:
            if release_free_memory():
                self.releases += 1
            self.base = private_resident_bytes() or now
