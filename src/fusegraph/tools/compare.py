"""``fusegraph compare``: the same model unoptimised (O0) beside optimised (O2), measured
(with ``--precision``: ``compare_precision.py``).

Rows: single-run latency (median, p90), throughput at batch 1 and at a larger batch when the
model's batch dim is symbolic, planned activation memory (arena) beside every tensor in its
own buffer, load time of a saved .fgm beside compiling from the model, kernels per run. A
model with symbolic input dims reports the kernels and memory of its compile at the batch-1
feeds' shapes (``specialize.py``), the one those runs executed.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bench import random_feeds_for
from .timing import measure


@dataclass
class Column:
    level: str
    compile_s: float
    kernels: int
    latency_ms: float
    p90_ms: float
    throughput: dict[int, float] = field(default_factory=dict)   # batch -> runs/s * batch
    arena_bytes: int | None = None
    naive_bytes: int | None = None
    outside_bytes: int | None = None      # allocated by kernels per run, not in the arena
    load_s: float | None = None


def memory_of(model) -> tuple[int | None, int | None]:
    """``model``'s planned arena and naive bytes (None without a memory plan)."""
    mem = model.report.memory
    if mem is None:
        return None, None
    return mem.arena_bytes, mem.naive_bytes


def _batchable(model) -> bool:
    return bool(model.inputs) and all(s.shape and not isinstance(s.shape[0], int) for s in model.inputs)


def compare(model_src: Any, runs: int = 20, budget_s: float = 10.0, big_batch: int = 8,
            config=None, feeds=None) -> list[Column]:
    import fusegraph as fg

    base = config or fg.Config()
    columns = []
    for level in ("O0", "O2"):
        cfg = base.replace(level=level, memory="off" if level == "O0" else base.memory)
        t0 = time.perf_counter()
        model = fg.compile(model_src, cfg)
        compile_s = time.perf_counter() - t0
        f1 = feeds or random_feeds_for(model)
        lat = measure(lambda: model.run(f1), runs=runs, warmup=2, budget_s=budget_s)
        ran = model.runs_as(f1)
        col = Column(level, compile_s, ran.report.kernel_count, lat.median_ms, lat.p90_ms,
                     {1: lat.per_second})
        if _batchable(model) and feeds is None:
            fb = random_feeds_for(model, batch=big_batch)
            big = measure(lambda: model.run(fb), runs=max(5, runs // 4), warmup=1, budget_s=budget_s)
            col.throughput[big_batch] = big.per_second * big_batch
        col.arena_bytes, col.naive_bytes = memory_of(ran)      # the compile the batch-1 runs executed
        mem = ran.report.memory
        col.outside_bytes = col.naive_bytes if level == "O0" else \
            (sum(d["bytes"] for d in mem.not_writable_into_arena) if mem is not None else None)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.fgm"
            model.save(path)
            t0 = time.perf_counter()
            fg.load(path)
            col.load_s = time.perf_counter() - t0
        columns.append(col)
    return columns


def megabytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def render(columns: list[Column], title: str):
    from rich.table import Table

    o0, o2 = columns
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("O0 (unoptimised)", justify="right")
    table.add_column("O2 (optimised)", justify="right")
    table.add_column("gain", justify="right")

    def row(name, a, b, fmt, better_low=True):
        gain = "-" if not a or not b else (f"{a / b:.2f}x" if better_low else f"{b / a:.2f}x")
        table.add_row(name, fmt(a), fmt(b), gain)

    row("latency median", o0.latency_ms, o2.latency_ms, lambda v: f"{v:.2f} ms")
    row("latency p90", o0.p90_ms, o2.p90_ms, lambda v: f"{v:.2f} ms")
    for batch in sorted(o0.throughput):
        if batch in o2.throughput:
            row(f"throughput, batch {batch}", o0.throughput[batch], o2.throughput[batch],
                lambda v: f"{v:.1f} /s", better_low=False)
    row("activation memory (O0: own buffers)", o0.naive_bytes, o2.arena_bytes, megabytes)
    row("allocated by kernels per run", o0.outside_bytes, o2.outside_bytes, megabytes)
    row("compile from the model", o0.compile_s, o2.compile_s, lambda v: f"{v * 1000:.0f} ms")
    row("load the saved .fgm", o0.load_s, o2.load_s, lambda v: f"{v * 1000:.0f} ms")
    row("kernels per run", o0.kernels, o2.kernels, str)
    return table
