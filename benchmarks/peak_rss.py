"""Peak RSS of a fresh process that compiles and runs each light model (random weights), with
fusegraph memory "off" vs "balanced", beside onnxruntime ORT_ENABLE_ALL, measured with
``/usr/bin/time -v`` (maximum resident set size). Prints a Markdown table.

    python benchmarks/peak_rss.py [--models resnet50,vgg19] [--runs 3] [--json out.json]

Each child process gets the model as an ONNX file path (weights inline) and its inputs as an
``.npz`` written by this script, so that it holds nothing but the engine and the model: it
compiles (or builds an onnxruntime session), runs ``--runs`` times, and exits. ``base`` is the
peak of a process that only imports the same modules (python + torch + onnx + fusegraph, or
+ onnxruntime); ``/w`` columns are (peak - base) / weight bytes: how many copies of the
weights the engine held at its peak, activations and workspace included.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from fusegraph.testing import zoo

_FG = """
import sys, numpy as np, fusegraph as fg, torch
torch.set_num_threads(2)
feeds = dict(np.load(sys.argv[3]))
m = fg.compile(sys.argv[1], fg.Config(memory=sys.argv[2], threads=2))
for _ in range(int(sys.argv[4])):
    m.run(feeds)
"""
_ORT = """
import sys, numpy as np, onnxruntime as ort
feeds = dict(np.load(sys.argv[2]))
so = ort.SessionOptions(); so.intra_op_num_threads = 2
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
for _ in range(int(sys.argv[3])):
    s.run(None, feeds)
"""
_BASE_FG = "import numpy, onnx, torch, fusegraph"
_BASE_ORT = "import numpy, onnx, onnxruntime"

MIB = float(1 << 20)


def peak_mb(code: str, *args: str) -> float:
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code, *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return kb / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    base_fg, base_ort = peak_mb(_BASE_FG), peak_mb(_BASE_ORT)
    print(f"base: python + torch + onnx + fusegraph {base_fg:.0f} MB; python + onnx + onnxruntime "
          f"{base_ort:.0f} MB (MB = MiB)\n")
    print("| model | weights MB | fusegraph off MB | off /w | fusegraph balanced MB | balanced /w "
          "| onnxruntime ALL MB | ort /w |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)
            weights = sum(len(t.raw_data) for t in proto.graph.initializer) / MIB
            path = str(Path(tmp) / f"{name}.onnx")
            feeds_path = str(Path(tmp) / f"{name}.npz")
            np.savez(feeds_path, **zoo.random_feeds(proto, seed=1))
            onnx.save(proto, path)
            del proto
            runs = str(args.runs)
            off = peak_mb(_FG, path, "off", feeds_path, runs)
            bal = peak_mb(_FG, path, "balanced", feeds_path, runs)
            ort = peak_mb(_ORT, path, feeds_path, runs)
            row = {"model": name, "weights_mb": weights, "off_mb": off, "balanced_mb": bal, "ort_mb": ort,
                   "base_fg_mb": base_fg, "base_ort_mb": base_ort}
            rows.append(row)
            print(f"| {name} | {weights:.1f} | {off:.0f} | {(off - base_fg) / weights:.2f} | {bal:.0f} | "
                  f"{(bal - base_fg) / weights:.2f} | {ort:.0f} | {(ort - base_ort) / weights:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
