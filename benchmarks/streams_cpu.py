"""CPU streams: latency of streams=1 against streams="auto" (and 2, 4, memory off), alternating.

    flock /tmp/fg_bench.lock python benchmarks/streams_cpu.py \
        [--models inception_v1,inception_v2,squeezenet,densenet121] [--threads 2] \
        [--rounds 10] [--runs 5] [--configs s1,auto,s1-thr]

Batch 1, random weights. Each round times every configuration ``--runs`` times (after 2
warm-up runs), configurations alternating so that load drift hits all alike; the table
shows, per configuration, the median over all runs (rounds x runs, 50 by default), the
median ratio to the first configuration over the rounds, the 10th percentile (the least
disturbed runs: on a shared machine it is the closest to a quiet one) and its ratio, and the
load average before and after each model. A model with stream workers is closed after each of its turns (its
workers exit), so the next configuration runs without them. Outputs of every configuration
are checked to be identical to the first one's. "auto" compiles with the timed calibration
(``runtime/stream_calibrate.py``); its plan is shown (streams, wide nodes, events,
estimates). Results are for the record (benchmarks/RESULTS_runtime.md), never test
assertions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.runtime.stream_calibrate import TeamHolder

KNOWN = {"s1": dict(streams=1), "s2": dict(streams=2), "s4": dict(streams=4), "auto": dict(streams="auto"),
         "s1-off": dict(streams=1, memory="off"), "s2-off": dict(streams=2, memory="off"),
         "s1-thr": dict(streams=1)}
# "s1-thr": streams=1 timed while an idle thread owns an OpenMP team, as the stream workers do
# (libgomp then throttles its spin-waiting): separates that effect from the streams' own.


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _plan_text(model) -> str:
    sp = model.plan.streams
    if sp is None:
        return "1 stream"
    est = ", ".join(f"{k}: {v / 1e3:.2f} ms" for k, v in sorted(sp.candidates.items()))
    return (f"{sp.num_streams} streams ({sp.algorithm}), {len(sp.wide)} of {len(sp.stream_of)} nodes wide, "
            f"{len(sp.events)} events; estimates {est}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v1,inception_v2,squeezenet,densenet121")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--configs", default="s1,auto,s1-thr")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    labels = args.configs.split(",")
    print(f"threads={args.threads} rounds={args.rounds} runs/round={args.runs} ({args.rounds * args.runs} runs "
          f"per configuration); started {time.strftime('%H:%M:%S')} load {_load()}")
    rows = []
    for name in args.models.split(","):
        proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0, calibrate=False)
        feeds = zoo.random_feeds(proto, seed=1)
        models = {k: fg.compile(proto, fg.Config(threads=args.threads, **KNOWN[k])) for k in labels}
        torch.set_num_threads(args.threads)
        ref = models[labels[0]].run(feeds)
        for k, m in models.items():
            out = m.run(feeds)
            same = all(np.array_equal(ref[o], out[o]) for o in ref)
            print(f"{name:13s} {k:6s} {_plan_text(m)}; outputs {'identical to' if same else 'DIFFER from'} {labels[0]}")
        load_before = _load()
        runs: dict[str, list[float]] = {k: [] for k in labels}
        per_round: dict[str, list[float]] = {k: [] for k in labels}
        for _ in range(args.rounds):
            for k in labels:
                m = models[k]
                holder = TeamHolder(args.threads) if k == "s1-thr" else None
                m.run(feeds)
                m.run(feeds)
                mine = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    m.run(feeds)
                    mine.append((time.perf_counter() - t0) * 1e3)
                runs[k] += mine
                per_round[k].append(statistics.median(mine))
                m.close()
                if holder is not None:
                    holder.close()
        load_after = _load()
        base = statistics.median(runs[labels[0]])
        for k in labels:
            med = statistics.median(runs[k])
            ratio = statistics.median(a / b for a, b in zip(per_round[k], per_round[labels[0]]))
            ordered = sorted(runs[k])
            low = ordered[len(ordered) // 10]
            rows.append((name, k, med, med / base, ratio, low, low / sorted(runs[labels[0]])[len(ordered) // 10],
                         load_before, load_after))
            print(f"{name:13s} {k:6s} median {med:8.2f} ms  x{med / base:5.3f} vs {labels[0]}, p10 {low:.2f} ms "
                  f"(median of per-round ratios x{ratio:5.3f}); load {load_before} -> {load_after}; "
                  f"rounds: {' '.join(f'{s:.1f}' for s in per_round[k])}")
    print(f"finished {time.strftime('%H:%M:%S')} load {_load()}")
    print("\n| model | config | median ms | ratio to " + labels[0] + " | per-round ratio | p10 ms | p10 ratio "
          "| load before -> after |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, k, med, r, rr, low, lr, lb, la in rows:
        print(f"| {name} | {k} | {med:.2f} | {r:.3f} | {rr:.3f} | {low:.2f} | {lr:.3f} | {lb} -> {la} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
