"""Latency of fusegraph vs onnxruntime (ORT_ENABLE_ALL), each engine in its own process, back to
back: the same models, inputs and thread count as ``bench_latency.py``, without one engine's idle
worker threads (onnxruntime's spinning pool, OpenMP's blocking time) sitting on the cores while
the other runs. Per model, ``--rounds`` rounds alternate a fresh onnxruntime process and a fresh
fusegraph process; each process warms up, then times ``--runs`` runs; the figure is the median
over every timed run of every round. Prints a Markdown table.

    python benchmarks/bench_latency_isolated.py [--threads 2] [--runs 20] [--rounds 3] [--models a,b]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import json, sys, time
import numpy as np
engine, path, threads, runs, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
import fusegraph as fg
from fusegraph.tools.bench import random_feeds_for, ort_runner
model = fg.compile(path, fg.Config(threads=threads))
feeds = random_feeds_for(model)
if engine == "onnxruntime":
    fn = ort_runner(path, threads, feeds)
    del model            # compiled only for the input specs (same feeds as fusegraph's)
    time.sleep(0.5)      # let torch's idle OpenMP threads go to sleep before timing
else:
    fn = lambda: model.run(feeds)
for _ in range(warmup):
    fn()
times = []
for _ in range(runs):
    t0 = time.perf_counter()
    fn()
    times.append((time.perf_counter() - t0) * 1000.0)
print(json.dumps(times))
"""


def _times(engine: str, path: Path, threads: int, runs: int, warmup: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", WORKER, engine, str(path), str(threads), str(runs), str(warmup)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_latency import model_files, print_footer
    from fusegraph.testing import zoo

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default=",".join(list(zoo.LIGHT_MODELS) + ["bert", "gpt2"]))
    args = ap.parse_args()
    print(f"{time.strftime('%H:%M:%S')} UTC, load average before: {os.getloadavg()[0]:.2f} "
          f"(on {os.cpu_count()} cores), {args.threads} threads, {args.rounds} rounds x {args.runs} runs\n")
    print("| model | fusegraph ms | onnxruntime ms | ratio |")
    print("|---|---:|---:|---:|")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in model_files(Path(tmp), args.models.split(",")).items():
            samples: dict[str, list[float]] = {"onnxruntime": [], "fusegraph": []}
            for _ in range(args.rounds):
                for engine in samples:
                    samples[engine] += _times(engine, path, args.threads, args.runs, args.warmup)
            fg_ms, ort_ms = statistics.median(samples["fusegraph"]), statistics.median(samples["onnxruntime"])
            ratios.append(fg_ms / ort_ms)
            print(f"| {name} | {fg_ms:.2f} | {ort_ms:.2f} | {fg_ms / ort_ms:.2f} |", flush=True)
    print_footer(ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
