"""Latency of fusegraph vs onnxruntime (ORT_ENABLE_ALL) on the nine light models (random
weights) and the BERT / GPT-2 exports, batch 1, fixed thread count, same process,
alternating blocks, median of >= 30 runs after warm-up. Prints a Markdown table.

    python benchmarks/bench_latency.py [--threads 2] [--runs 30] [--models resnet50,bert]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fusegraph.testing import zoo  # noqa: E402
from fusegraph.tools.bench import bench  # noqa: E402


def model_files(folder: Path, names: list[str]) -> dict[str, Path]:
    files = {}
    for name in names:
        if name in zoo.LIGHT_MODELS:
            path = folder / f"{name}.onnx"
            onnx.save(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0), str(path))
            files[name] = path
    if {"bert", "gpt2"} & set(names):
        from model_builders import build_transformer_models
        for name, path in build_transformer_models(folder).items():
            if name in names:
                files[name] = path
    return files


def ort_extended_nodes(path: Path) -> int:
    """onnxruntime's node count at ORT_ENABLE_EXTENDED (the issue's kernel budget)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(path.with_suffix(".extended.onnx"))
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


def print_footer(ratios: list[float]) -> None:
    """The geometric mean of the ratios and the load average, under a table."""
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    print(f"\ngeometric mean ratio over {len(ratios)} models: {geo:.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--models", default=",".join(list(zoo.LIGHT_MODELS) + ["bert", "gpt2"]))
    args = ap.parse_args()
    names = args.models.split(",")
    print(f"load average before: {os.getloadavg()[0]:.2f} (on {os.cpu_count()} cores)\n")
    print("| model | fusegraph ms | onnxruntime ms | ratio | kernels | ORT_EXTENDED nodes |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in model_files(Path(tmp), names).items():
            r = bench(str(path), vs=("onnxruntime",), threads=args.threads, runs=args.runs)
            ratios.append(r.ratio("onnxruntime"))
            print(f"| {name} | {r.fusegraph_ms:.2f} | {r.peers_ms['onnxruntime']:.2f} | "
                  f"{r.ratio('onnxruntime'):.2f} | {r.kernels} | {ort_extended_nodes(path)} |", flush=True)
    print_footer(ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
