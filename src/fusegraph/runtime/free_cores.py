"""How many of this process's cores other processes are leaving free: the thread count a run
takes under ``Config.thread_policy = "free_cores"``.

oneDNN's OpenMP build splits a primitive's work statically between the threads it was made
for, and each call ends at a barrier: when another process keeps one of the cores busy, the
thread that shares that core finishes its share a scheduler time slice late, on every call.
onnxruntime's own pool lets the calling thread take over the work a descheduled worker has
not started; a static OpenMP partition cannot. So a run here takes no more threads than the
cores other processes leave free (``Executor`` runs a binding made for that count).

``CoreSampler.free(wanted)``: from ``/proc/stat``, the busy time of the CPUs this process may
run on (``sched_getaffinity``) since the previous sample, less this process's own CPU time
over the same window (``time.process_time``: every thread of the process), gives the cores
others kept busy; ``wanted`` less their (rounded) count, at least one. A sample is taken at most
every ``WINDOW_S`` seconds; between samples the previous answer stands, so a run pays a file
read at most four times a second. Where ``/proc/stat`` cannot be read (not Linux), every core
counts as free. ``HYSTERESIS`` keeps a count from flapping when the neighbours sit near a
half-core boundary. Nothing here changes a thread count.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

WINDOW_S = 0.25
HYSTERESIS = 0.15


def _read_proc_stat() -> dict[int, tuple[int, int]]:
    """Per CPU: (busy jiffies, all jiffies) from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *fields = line.split()
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]             # idle + iowait
            out[int(name[3:])] = (sum(values) - idle, sum(values))
    return out


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


class CoreSampler:
    def __init__(self, read_stat: Callable[[], dict[int, tuple[int, int]]] = _read_proc_stat,
                 own_cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic,
                 cpus: Callable[[], set[int]] = _affinity):
        self._read_stat, self._own_cpu, self._clock, self._cpus = read_stat, own_cpu, clock, cpus
        self._lock = threading.Lock()
        self._last: tuple[float, float, float, float] | None = None   # (time, own cpu, busy s, all s)
        self.others_busy = 0.0          # cores other processes kept busy in the last window
        self.available = True

    def _sample(self) -> tuple[float, float, float, float] | None:
        try:
            stat = self._read_stat()
        except (OSError, ValueError):
            self.available = False
            return None
        mine = self._cpus() & set(stat)
        if not mine:
            self.available = False
            return None
        busy = sum(stat[c][0] for c in mine)
        total = sum(stat[c][1] for c in mine)
        return self._clock(), self._own_cpu(), float(busy), float(total)

    def update(self) -> None:
        """Take a sample if the window has passed (the first call only starts the window)."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < WINDOW_S:
                return
            sample = self._sample()
            if sample is None:
                return
            if self._last is not None:
                t0, own0, busy0, total0 = self._last
                t1, own1, busy1, total1 = sample
                ncpu = len(self._cpus())
                if total1 > total0:
                    busy_cores = (busy1 - busy0) / (total1 - total0) * ncpu    # jiffies -> cores, any HZ
                    own_cores = (own1 - own0) / max(t1 - t0, 1e-9)
                    self.others_busy = max(0.0, busy_cores - own_cores)
            self._last = sample

    def free(self, wanted: int, current: int | None = None) -> int:
        """The thread count for a run that wants ``wanted``: at most the cores others leave
        free, at least one. ``current``: the count chosen last time (it moves only when the
        neighbours' load is ``HYSTERESIS`` past the boundary)."""
        self.update()
        if not self.available or wanted <= 1:
            return max(1, wanted)
        free = len(self._cpus()) - self.others_busy
        count = math.floor(free + 0.5)
        if current is not None and count != current and abs(free + 0.5 - max(count, current)) < HYSTERESIS:
            count = current
        return max(1, min(wanted, count))


SAMPLER = CoreSampler()
