"""``Config(aggressive_fusion=True)`` against the default, per model: kernels per run, planned
arena, compile time, latency, and the largest difference of the outputs (relative to their
scale) between the two.

    flock /tmp/fusegraph-bench.lock python benchmarks/aggressive_fusion.py --models a.onnx,b.onnx [--runs 20]

2 threads, batch 1, random feeds (``fusegraph.tools.bench.random_feeds_for``). Latency: medians
of ``--runs`` runs, the two compiles in alternating blocks in ONE process
(``fusegraph.tools.bench.alternate``), measured only where the knob changed the graph (else
the two run the same kernels); ``--runs 0``: the census alone (no timing: no lock needed). The rules that applied and how often are listed per model.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time

import numpy as np

RULES = ("recompute_into_consumers", "pack_qkv_padded", "sibling_products")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated ONNX paths")
    ap.add_argument("--runs", type=int, default=20, help="0: no latency (the census only)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    import fusegraph as fg
    from fusegraph.tools.bench import alternate, random_feeds_for
    torch.set_num_threads(2)
    rows = []
    print("| model | kernels default -> aggressive | arena KiB | compile s | ms default | ms aggressive "
          "| ratio | max rel diff | rules applied |")
    print("|---|---|---|---|---:|---:|---:|---:|---|")
    for path in args.models.split(","):
        name = os.path.basename(path).split("-")[0].removesuffix(".onnx")
        built = {}
        for key, on in (("default", False), ("aggressive", True)):
            t0 = time.perf_counter()
            built[key] = fg.compile(path, fg.Config(threads=2, aggressive_fusion=on))
            built[key + "_s"] = time.perf_counter() - t0
        d, a = built["default"], built["aggressive"]
        feeds = random_feeds_for(d)
        x, y = d.run(feeds), a.run(feeds)
        diff = max((float(np.abs(x[k] - y[k]).max() / max(np.abs(x[k]).max(), 1e-30))
                    for k in x if np.issubdtype(x[k].dtype, np.floating)), default=0.0)
        applied = collections.Counter(f.rule for f in a.report.fusions if f.applied and f.rule in RULES)
        changed = bool(applied) and args.runs > 0
        ms = {}
        if changed:
            times = alternate({"default": lambda: d.run(feeds), "aggressive": lambda: a.run(feeds)}, runs=args.runs)
            ms = {k: statistics.median(v) for k, v in times.items()}
        row = {"model": name, "kernels": [d.report.kernel_count, a.report.kernel_count],
               "arena_bytes": [d.report.memory.arena_bytes, a.report.memory.arena_bytes],
               "compile_s": [built["default_s"], built["aggressive_s"]], "ms": ms, "max_rel_diff": diff,
               "applied": dict(applied)}
        rows.append(row)
        lat = (f"{ms['default']:.2f} | {ms['aggressive']:.2f} | {ms['aggressive'] / ms['default']:.3f}" if ms
               else "- | - | -")
        print(f"| {name} | {row['kernels'][0]} -> {row['kernels'][1]} | "
              f"{row['arena_bytes'][0] / 1024:.0f} -> {row['arena_bytes'][1] / 1024:.0f} | "
              f"{row['compile_s'][0]:.2f} / {row['compile_s'][1]:.2f} | {lat} | {diff:.1e} | "
              f"{', '.join(f'{k} {v}' for k, v in applied.items()) or '-'} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
