"""Recurrent models before and after oneDNN's recurrent primitives (``dnnl/rnn.py``), beside
onnxruntime: latency, private memory and build time, one row per model.

    flock /tmp/fusegraph-bench.lock python benchmarks/rnn_table.py --models a.onnx,b.onnx [--runs 30]

Engines, 2 threads, batch 1, random normal inputs: ``ort`` (onnxruntime fp32 ORT_ENABLE_ALL),
``fg_before`` (fusegraph with its recurrent kernel family switched off in this process: every
RNN / GRU / LSTM node on the op's own portable kernel, all else as ``fg_after``) and
``fg_after`` (``fg.Config(threads=2)``). Latency: medians of ``--runs`` runs, the engines in
alternating blocks in ONE process (``fusegraph.tools.bench.alternate``). Memory: RssAnon after
10 runs minus after import, a fresh process per engine and model. Build: ``fg.compile`` /
session creation in this process. The kernel census of each fusegraph engine beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

_CHILD = r"""
import json, sys
engine, path = sys.argv[1:3]
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) / 1024
import numpy as np
if engine == "ort":
    import onnxruntime as ort
    before = rss()
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]
    run = lambda f: s.run(None, f)
    shape = i.shape
    name = i.name
else:
    import fusegraph as fg
    sys.path.insert(0, sys.argv[3])
    import rnn_table
    before = rss()
    if engine == "fg_before":
        rnn_table.recurrent_family_off()
    m = fg.compile(path, fg.Config(threads=2))
    spec = m.graph.inputs[0]
    name, shape = spec.name, list(spec.shape)
    run = m.run
feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
for _ in range(10):
    run(feeds)
print(json.dumps({"rss": rss() - before}))
"""


def recurrent_family_off() -> None:
    """This process's CPU backend claims no recurrent node (the "before" engine)."""
    from fusegraph.runtime.backends.cpu import dnnl
    dnnl.RECURRENT.clear()


def census(model) -> dict:
    k = model.report.kernels
    return {"kernels": model.report.kernel_count, "implementations": k["implementations"],
            "declined": [(d["op"], d["reason"]) for d in k["declined"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated ONNX paths")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    import fusegraph as fg
    from fusegraph.runtime.backends.cpu import dnnl
    from fusegraph.tools.bench import alternate, ort_runner
    torch.set_num_threads(2)
    print("| model | ort ms | fg before ms (x ort) | fg after ms (x ort) | RssAnon MiB ort / before / after | "
          "build s ort / before / after | kernels before / after | implementations (after) | max rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|", flush=True)
    rows = []
    for path in args.models.split(","):
        name = os.path.basename(path).split("-")[0].removesuffix(".onnx")
        saved = set(dnnl.RECURRENT)
        t0 = time.perf_counter()
        after = fg.compile(path, fg.Config(threads=2))
        build_after = time.perf_counter() - t0
        recurrent_family_off()
        t0 = time.perf_counter()
        before = fg.compile(path, fg.Config(threads=2))
        build_before = time.perf_counter() - t0
        dnnl.RECURRENT.update(saved)
        spec = after.graph.inputs[0]
        feeds = {spec.name: np.random.default_rng(0).standard_normal(list(spec.shape)).astype(np.float32)}
        t0 = time.perf_counter()
        ort = ort_runner(path, 2, feeds)
        build_ort = time.perf_counter() - t0
        want, got = ort()[0], after.run(feeds)
        err = float(np.abs(next(iter(got.values())) - want).max() / max(np.abs(want).max(), 1e-30))
        times = alternate({"ort": ort, "fg_before": lambda: before.run(feeds), "fg_after": lambda: after.run(feeds)},
                          runs=args.runs)
        row = {"model": name, "err_vs_ort": err,
               "ms": {k: statistics.median(v) for k, v in times.items()},
               "build_s": {"ort": build_ort, "fg_before": build_before, "fg_after": build_after},
               "census": {"fg_before": census(before), "fg_after": census(after)},
               "arena_bytes": {"fg_before": before.report.memory.arena_bytes,
                               "fg_after": after.report.memory.arena_bytes}}
        if args.memory:
            here = os.path.dirname(os.path.abspath(__file__))
            row["rss_mib"] = {}
            for engine in ("ort", "fg_before", "fg_after"):
                out = subprocess.run([sys.executable, "-c", _CHILD, engine, path, here], capture_output=True,
                                     text=True, check=True)
                row["rss_mib"][engine] = json.loads(out.stdout.strip().splitlines()[-1])["rss"]
        rows.append(row)
        ms = row["ms"]
        print(f"| {name} | {ms['ort']:.2f} | {ms['fg_before']:.2f} ({ms['fg_before'] / ms['ort']:.2f}) | "
              f"{ms['fg_after']:.2f} ({ms['fg_after'] / ms['ort']:.2f}) | "
              + (" / ".join(f"{row['rss_mib'][e]:.0f}" for e in ("ort", "fg_before", "fg_after"))
                 if args.memory else "-")
              + f" | {build_ort:.3f} / {build_before:.2f} / {build_after:.2f} | "
              f"{row['census']['fg_before']['kernels']} / {row['census']['fg_after']['kernels']} | "
              f"{row['census']['fg_after']['implementations']} | {err:.1e} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
