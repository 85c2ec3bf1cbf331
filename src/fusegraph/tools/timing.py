"""Latency measurement shared by ``bench``, ``compare`` and ``demo``: warm-up, then the
median and p90 of many timed runs. Never used in tests as an assertion."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Latency:
    median_ms: float
    p90_ms: float
    runs: int

    @property
    def per_second(self) -> float:
        return 1000.0 / self.median_ms if self.median_ms > 0 else float("inf")


def measure(fn: Callable[[], object], runs: int = 30, warmup: int = 3, budget_s: float | None = None) -> Latency:
    """Time ``fn``: ``warmup`` untimed calls, then up to ``runs`` timed ones (or until ``budget_s``)."""
    for _ in range(warmup):
        fn()
    samples = []
    start = time.perf_counter()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
        if budget_s is not None and time.perf_counter() - start > budget_s and len(samples) >= 5:
            break
    samples.sort()
    p90 = samples[min(len(samples) - 1, int(round(0.9 * (len(samples) - 1))))]
    return Latency(statistics.median(samples), p90, len(samples))
