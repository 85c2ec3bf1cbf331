"""CPU streams: latency of streams=1 against streams=2 (and "auto"), alternating, and the
memory arena against memory off.

    python benchmarks/streams_cpu.py [--models inception_v1,squeezenet] [--threads 2] [--rounds 7]

Batch 1, random weights. Each round times every configuration once with
``fusegraph.timing.measure`` (median of ``--runs``), configurations alternating so load drift
hits all alike; the table shows the median over rounds and the ratio to streams=1. Results
are for the record (benchmarks/RESULTS.md), never test assertions.
"""
from __future__ import annotations

import argparse
import statistics

import onnx
import torch

import fusegraph as fg
from fusegraph import zoo
from fusegraph.timing import measure


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v1,squeezenet")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--configs", default="s1,s2,auto,s1-off")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    known = {"s1": dict(streams=1), "s2": dict(streams=2), "s4": dict(streams=4), "auto": dict(streams="auto"),
             "s1-off": dict(streams=1, memory="off"), "s2-off": dict(streams=2, memory="off")}
    labels = args.configs.split(",")
    print(f"threads={args.threads} rounds={args.rounds} runs/round={args.runs}")
    for name in args.models.split(","):
        proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0, calibrate=False)
        feeds = zoo.random_feeds(proto, seed=1)
        models = {k: fg.compile(proto, fg.Config(threads=args.threads, **known[k])) for k in labels}
        torch.set_num_threads(args.threads)
        planned = {k: (m.plan.streams.num_streams if m.plan.streams is not None else 1) for k, m in models.items()}
        samples: dict[str, list[float]] = {k: [] for k in labels}
        for _ in range(args.rounds):
            for k in labels:
                samples[k].append(measure(lambda m=models[k]: m.run(feeds), runs=args.runs, warmup=2).median_ms)
        base = statistics.median(samples[labels[0]])
        for k in labels:
            med = statistics.median(samples[k])
            print(f"{name:14s} {k:8s} streams={planned[k]}  median {med:8.2f} ms  x{med / base:5.3f} vs {labels[0]}"
                  f"  (rounds: {' '.join(f'{s:.1f}' for s in samples[k])})")
        for m in models.values():
            m.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
