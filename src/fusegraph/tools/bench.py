"""``fusegraph bench``: fusegraph's latency beside a peer, in the same process.

Both engines run the same inputs at the same thread count, in alternating contiguous blocks
(so drift in machine load hits both alike), after warm-up; the median of every run is
reported with the ratio. Peers: ``onnxruntime`` (ORT_ENABLE_ALL, sequential execution) and
``torch`` (the same graph unoptimised, op by op on PyTorch eager kernels). onnxruntime is a
benchmark peer only: imported here, lazily, never by the compiler or runtime.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import UsageError


@dataclass
class BenchResult:
    model: str
    threads: int
    runs: int
    fusegraph_ms: float
    peers_ms: dict[str, float] = field(default_factory=dict)
    kernels: int = 0
    shapes: dict[str, list[int]] = field(default_factory=dict)    # the inputs' shapes it ran at

    def ratio(self, peer: str) -> float:
        return self.fusegraph_ms / self.peers_ms[peer]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratios"] = {p: self.ratio(p) for p in self.peers_ms}
        return d


def random_feeds_for(model, seed: int = 0, batch: int = 1,
                     dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs matching ``model.inputs``; a symbolic dim named in ``dims`` takes that
    size, the others ``batch`` (first) or 1. A name in ``dims`` that no input has is a
    UsageError."""
    dims = dict(dims or {})
    named = {d for spec in model.inputs for d in (spec.shape or ()) if isinstance(d, str)}
    unknown = sorted(set(dims) - named)
    if unknown:
        raise UsageError(f"{getattr(model, 'name', 'the model')}: no input has a symbolic dim named "
                         f"{', '.join(map(repr, unknown))}; its symbolic dims are {sorted(named) or 'none'}")
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in model.inputs:
        shape = [d if isinstance(d, int) else dims.get(d, batch if i == 0 else 1)
                 for i, d in enumerate(spec.shape or ())]
        dt = spec.dtype.to_numpy()
        if np.issubdtype(dt, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(dt)
    return feeds


def ort_runner(model_path: str, threads: int, feeds) -> Callable[..., object]:
    """A run of onnxruntime (ORT_ENABLE_ALL) on ``feeds``, or on the feeds given to the call."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return lambda other=None: sess.run(names, feeds if other is None else other)


SETTLE_S = 0.05


def alternate(runners: dict[str, Callable[[], object]], runs: int = 30, warmup: int = 5,
              block: int = 5, settle_s: float = SETTLE_S) -> dict[str, list[float]]:
    """Time each runner in alternating blocks of ``block`` runs until each has ``runs`` samples.

    Before each block the process pauses ``settle_s`` (untimed), so the previous engine's idle
    worker threads stop spinning first: onnxruntime's pool spins on a core after its block
    (``session.intra_op.allow_spinning``, on by default), and every 2-thread region of the next
    engine would wait for that core (benchmarks/RESULTS.md, "Latency vs onnxruntime (issue 4)");
    OpenMP's team spins after
    torch's regions the same way.

    Rounds run the runners forwards and backwards in turn (A B, B A, A B ...), so no runner
    always follows the same one: a pause too short for some pool would otherwise tax the
    same runner every round (measured on bert: the block after onnxruntime's ran slower in one
    run, and not in the next)."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners.items())
    while min(len(s) for s in samples.values()) < runs:
        for name, fn in order:
            if settle_s:
                time.sleep(settle_s)
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t0) * 1000.0)
        order.reverse()
    return samples


def bench(model_path: str, vs: tuple[str, ...] = ("onnxruntime",), threads: int = 2, runs: int = 30,
          warmup: int = 5, config=None, dims: dict[str, int] | None = None) -> BenchResult:
    """``dims``: sizes of named symbolic input dims (``{"seq": 128}``): a model with dynamic axes
    runs its compile at those shapes (``compiler/specialize.py``), made in the warm-up."""
    import fusegraph as fg

    config = (config or fg.Config()).replace(threads=threads)
    is_artifact = Path(model_path).suffix == ".fgm"
    if is_artifact and vs:
        raise UsageError(f"{model_path}: peers ({', '.join(vs)}) run the .onnx model, not an .fgm artifact")
    model = fg.load(model_path, threads=threads) if is_artifact else fg.compile(model_path, config)
    feeds = random_feeds_for(model, dims=dims)
    runners: dict[str, Callable[[], object]] = {"fusegraph": lambda: model.run(feeds)}
    for peer in vs:
        if peer == "onnxruntime":
            runners[peer] = ort_runner(model_path, threads, feeds)
        elif peer == "torch":
            eager = fg.compile(model_path, config.replace(level="O0", memory="off"))
            runners[peer] = lambda: eager.run(feeds)
        else:
            raise UsageError(f"unknown peer {peer!r}; choose onnxruntime or torch")
    samples = alternate(runners, runs=runs, warmup=warmup)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return BenchResult(model=str(model_path), threads=threads, runs=runs, fusegraph_ms=med.pop("fusegraph"),
                       peers_ms=med, kernels=model.runs_as(feeds).report.kernel_count,
                       shapes={k: list(v.shape) for k, v in feeds.items()})
