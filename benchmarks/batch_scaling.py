"""What batching can buy a compute-bound model on this machine: time per image of a light model
compiled for batch 1, 2, 4, 8 (as ``fusegraph serve`` compiles its batch-size variants), at 1
and 2 intra-op threads. It bounds the serving benchmark: with ``instances`` x ``threads`` =
the cores, batching can only win what a bigger batch saves per image.

    python benchmarks/batch_scaling.py [--model resnet50] [--sizes 1,2,4,8] [--threads 1,2] [--runs 6]

Steady state: each model runs twice untimed at the measured thread count, then the median of
``--runs``. Not a test.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.serve.model import _with_batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=6)
    args = ap.parse_args()
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(args.model)), seed=0)
    before = torch.get_num_threads()
    print(f"{args.model}: ms per run (ms per image), median of {args.runs}")
    print("threads  " + "  ".join(f"batch {s:>2}        " for s in map(int, args.sizes.split(","))))
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        cells = []
        for size in map(int, args.sizes.split(",")):
            model = fg.compile(_with_batch(proto, 0, size) if size != 1 else proto, config=fg.Config(threads=None))
            feeds = {s.name: np.random.default_rng(0).standard_normal(s.shape).astype(np.float32) for s in model.inputs}
            for _ in range(2):
                model.run(feeds)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                model.run(feeds)
                times.append((time.perf_counter() - t0) * 1000)
            med = statistics.median(times)
            cells.append(f"{med:7.1f} ({med / size:5.1f})")
            model.close()
        print(f"{threads:>7}  " + "  ".join(cells))
    torch.set_num_threads(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
