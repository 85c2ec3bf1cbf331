"""Load time of a saved .fgm beside compile time and onnxruntime's session creation
(ORT_ENABLE_ALL), per light model (random weights), median of 3 each, in one process.

    python benchmarks/load_time.py [--models resnet50,vgg19]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

import fusegraph as fg
from fusegraph import zoo


def median_s(fn, repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    args = ap.parse_args()
    print("| model | compile ms | .fgm load ms | load / compile | onnxruntime session ms | load / ort |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)
            onnx_path, fgm = str(Path(tmp) / f"{name}.onnx"), Path(tmp) / f"{name}.fgm"
            onnx.save(proto, onnx_path)
            fg.compile(onnx_path).save(fgm)
            compile_s = median_s(lambda: fg.compile(onnx_path))
            load_s = median_s(lambda: fg.load(fgm))
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads = 2
            ort_s = median_s(lambda: ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"]))
            print(f"| {name} | {compile_s * 1e3:.0f} | {load_s * 1e3:.0f} | {load_s / compile_s:.0%} | "
                  f"{ort_s * 1e3:.0f} | {load_s / ort_s:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
