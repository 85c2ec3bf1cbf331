"""Peak RSS of a fresh process that compiles and runs each light model (random weights), with
fusegraph memory "off" vs "balanced", beside onnxruntime ORT_ENABLE_ALL, measured with
``/usr/bin/time -v`` (maximum resident set size). Prints a Markdown table.

    python benchmarks/peak_rss.py [--models resnet50,vgg19]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from fusegraph import zoo

_FG = """
import sys, numpy as np, onnx, fusegraph as fg, torch
from fusegraph import zoo
torch.set_num_threads(2)
m = fg.compile(sys.argv[1], fg.Config(memory=sys.argv[2], threads=2))
feeds = zoo.random_feeds(onnx.load(sys.argv[1], load_external_data=False), seed=1)
for _ in range(3):
    m.run(feeds)
"""
_ORT = """
import sys, onnx, onnxruntime as ort
from fusegraph import zoo
so = ort.SessionOptions(); so.intra_op_num_threads = 2
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
feeds = zoo.random_feeds(onnx.load(sys.argv[1], load_external_data=False), seed=1)
for _ in range(3):
    s.run(None, feeds)
"""


def peak_mb(code: str, *args: str) -> float:
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code, *args],
                          capture_output=True, text=True, check=True)
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return kb / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    args = ap.parse_args()
    print("| model | weights MB | fusegraph off MB | fusegraph balanced MB | onnxruntime MB |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)
            weights = sum(len(t.raw_data) for t in proto.graph.initializer) / 2**20
            path = str(Path(tmp) / f"{name}.onnx")
            onnx.save(proto, path)
            off = peak_mb(_FG, path, "off")
            bal = peak_mb(_FG, path, "balanced")
            ort = peak_mb(_ORT, path)
            print(f"| {name} | {weights:.1f} | {off:.0f} | {bal:.0f} | {ort:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
