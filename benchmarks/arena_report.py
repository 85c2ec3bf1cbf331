"""The runtime arena on the light models: planned arena against the lower bound and the naive
sum, how much of it the kernels really write (``out=``), and the bytes a run still allocates.

    python benchmarks/arena_report.py [--models a,b] [--extra bert.onnx,...] [--json out.json]

Per model (batch 1, random weights): arena, lower bound and naive bytes for ``balanced`` and
``tight``, the order tight chose, and the order floor (``report.memory.order_floor_bytes``: no
execution order's lower bound is below it, so where the default order meets it, tight cannot
lower the lower bound by reordering); the nodes (and bytes) writing into the arena vs those whose kernel allocates
(``report.memory.not_writable_into_arena``); the bytes allocated during one run (torch
profiler, ``profile_memory``; the generated code's run only) with memory off and balanced, the
last against the naive bytes (every activation in its own buffer) as the share of the
activations allocated outside the plan; and a check that every
arena-written result sits at the same in-arena address on two runs. For the record
(benchmarks/RESULTS.md), not a test.
"""
from __future__ import annotations

import argparse
import json

import onnx
from torch.profiler import ProfilerActivity, profile

import fusegraph as fg
from fusegraph.testing import zoo

MB = float(1 << 20)


def allocated_per_run(model, feeds) -> float:
    """MiB torch allocates during one run of the generated code (the feeds already converted;
    the copies ``model.run`` makes of the outputs it hands back are not counted). The oneDNN
    kernels run with a user scratchpad: they allocate nothing during a run."""
    from fusegraph.runtime.feeds import convert_feeds
    ex = model._executor
    tensors = convert_feeds(model.name, ex.inputs, feeds)
    ex.run_tensors(tensors)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        ex.run_tensors(tensors)
    return sum(max(k.self_cpu_memory_usage, 0) for k in prof.key_averages()) / MB


def stable_addresses(model, feeds) -> bool:
    calls = {c.index: c for c in model._executor.binding.calls if c.out is not None}
    arena = model._executor.arena
    runs = []
    for _ in range(2):
        seen = {}
        def hook(i, phase, outs, seen=seen):
            if phase == 1 and i in calls:
                seen[i] = [t.data_ptr() for t in outs]
        model.run(feeds, hook=hook)
        runs.append(seen)
    return runs[0] == runs[1] and all(arena.lo <= p < arena.hi or t.numel() == 0
                                      for i, ps in runs[0].items() for p, t in zip(ps, calls[i].out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--extra", default="", help="ONNX files (random weights already), by path")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':14s} {'arena':>8s} {'lower':>8s} {'ratio':>6s} {'naive':>8s} {'tight-lb':>8s} "
          f"{'floor':>8s} {'tight order':>16s}  "
          f"{'out= nodes':>10s} {'MiB':>6s}  {'kernel-alloc':>12s} {'MiB':>6s}  {'alloc/run off':>13s} "
          f"{'balanced':>8s}  stable")
    for name in [m for m in args.models.split(",") if m] + [p for p in args.extra.split(",") if p]:
        proto = onnx.load(name) if name.endswith(".onnx") else \
            zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0, calibrate=False)
        feeds = zoo.random_feeds(proto, seed=1)
        bal = fg.compile(proto, fg.Config(memory="balanced"))
        tight = fg.compile(proto, fg.Config(memory="tight"))
        off = fg.compile(proto, fg.Config(memory="off"))
        mem = bal.report.memory
        calls = bal._executor.binding.calls
        slots = bal.plan.slots
        written = [c for c in calls if c.out is not None]
        written_mb = sum(slots[o.name][1] for c in written for o in c.node.outputs) / MB
        slow = mem.not_writable_into_arena
        row = {"model": name, "arena_mb": mem.arena_bytes / MB, "lower_bound_mb": mem.lower_bound_bytes / MB,
               "naive_mb": mem.naive_bytes / MB, "tight_lower_bound_mb": tight.report.memory.lower_bound_bytes / MB,
               "tight_arena_mb": tight.report.memory.arena_bytes / MB,
               "tight_order": tight.report.memory.order,
               "order_floor_mb": (mem.order_floor_bytes or 0) / MB, "order_floor_node": mem.order_floor_node,
               "out_nodes": len(written), "out_mb": written_mb, "kernel_alloc_nodes": len(slow),
               "kernel_alloc_mb": sum(d["bytes"] for d in slow) / MB,
               "alloc_per_run_off_mb": allocated_per_run(off, feeds),
               "alloc_per_run_balanced_mb": allocated_per_run(bal, feeds),
               "stable": stable_addresses(bal, feeds)}
        name = name.rsplit("/", 1)[-1]
        row["model"] = name
        rows.append(row)
        print(f"{name:14s} {row['arena_mb']:8.2f} {row['lower_bound_mb']:8.2f} "
              f"{row['arena_mb'] / max(row['lower_bound_mb'], 1e-9):6.3f} {row['naive_mb']:8.2f} "
              f"{row['tight_lower_bound_mb']:8.2f} {row['order_floor_mb']:8.2f} {row['tight_order']:>16s}  "
              f"{row['out_nodes']:10d} {row['out_mb']:6.2f}  "
              f"{row['kernel_alloc_nodes']:12d} {row['kernel_alloc_mb']:6.2f}  {row['alloc_per_run_off_mb']:13.2f} "
              f"{row['alloc_per_run_balanced_mb']:8.2f} ({100 * row['alloc_per_run_balanced_mb'] / row['naive_mb']:.1f} %)"
              f"  {row['stable']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
