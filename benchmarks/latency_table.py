"""Latency against onnxruntime in one process, alternating (``fusegraph.tools.bench.alternate``):
one row per model, the median of ``--runs`` runs per engine, for the default config and any
extra configs given as ``field=value``.

    python benchmarks/latency_table.py [--models squeezenet,a.onnx] [--runs 30] [fast_math=True ...]

Light models get random weights (``zoo.randomize_weights``, seed 0); a ``.onnx`` path is used
as it is (the BERT / GPT-2 / MobileNetV2 exports of ``tests/model_builders.py``). 2 threads.
Prints each median in ms and its ratio to onnxruntime's, and the geometric mean of the
default config's ratios.
"""
from __future__ import annotations

import argparse
import ast
import math
import os
import statistics
import tempfile

import onnx
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.tools.bench import ort_runner, alternate


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("configs", nargs="*", help="extra configs, field=value (a Python literal)")
    args = ap.parse_args(argv)
    configs = {"default": {}}
    for item in args.configs:
        key, _, value = item.partition("=")
        configs[item] = {key: ast.literal_eval(value)}
    torch.set_num_threads(2)
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = name
            if not name.endswith(".onnx"):
                path = os.path.join(tmp, name + ".onnx")
                onnx.save(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0), path)
            feeds = zoo.random_feeds(onnx.load(path))
            engines = {"onnxruntime": ort_runner(path, 2, feeds)}
            for label, changes in configs.items():
                model = fg.compile(path, config=fg.Config(threads=2, **changes))
                engines[label] = (lambda m=model: m.run(feeds))
            med = {k: statistics.median(v) for k, v in alternate(engines, runs=args.runs).items()}
            ratios.append(med["default"] / med["onnxruntime"])
            cells = " ".join(f"{k}={v:.2f}ms({v / med['onnxruntime']:.2f})" for k, v in med.items())
            print(f"{os.path.basename(name)} {cells}", flush=True)
    print(f"geomean default / onnxruntime: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
