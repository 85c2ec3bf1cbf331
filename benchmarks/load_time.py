"""Load time of a saved .fgm beside compile time and onnxruntime's session creation
(ORT_ENABLE_ALL, 2 intra-op threads), per light model (random weights).

Two settings, each column saying what it includes:
- warm process (one process for everything, as ``fusegraph compare`` measures): median of 3 of
  ``fg.compile(path)``, ``fg.load(fgm)`` and ``ort.InferenceSession(path)``, after one compile
  and save of the model; oneDNN's primitive caches are warm.
- fresh process (what ``fusegraph run OUT.fgm`` sees): a new Python process per engine and
  model, after its import, times the load (session creation), the first run and the median of
  the next 3 runs. The imports (``import fusegraph``, ``import onnxruntime``) are measured once
  each, in processes of their own, and are in no other column.

    python benchmarks/load_time.py [--models resnet50,vgg19] [--no-fresh]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

import fusegraph as fg
from fusegraph.testing import zoo

_FRESH = r"""
import json, statistics, sys, time
engine, path, onnx_path = sys.argv[1:4]
import numpy as np
if engine == "fusegraph":
    import fusegraph as fg
    t0 = time.perf_counter(); m = fg.load(path); load = time.perf_counter() - t0
    run = m.run
    feeds = {v.name: np.random.default_rng(0).random(tuple(int(d) for d in v.shape), dtype=np.float32)
             for v in m.inputs}
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 2
    t0 = time.perf_counter(); s = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    load = time.perf_counter() - t0
    run = lambda f: s.run(None, f)
    feeds = {i.name: np.random.default_rng(0).random(tuple(i.shape), dtype=np.float32) for i in s.get_inputs()}
t0 = time.perf_counter(); run(feeds); first = time.perf_counter() - t0
later = []
for _ in range(3):
    t0 = time.perf_counter(); run(feeds); later.append(time.perf_counter() - t0)
print(json.dumps({"load": load, "first": first, "run": statistics.median(later)}))
"""


def median_s(fn, repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def fresh(engine: str, fgm: Path, onnx_path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _FRESH, engine, str(fgm), onnx_path], check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def import_s(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--no-fresh", action="store_true", help="skip the fresh-process columns")
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.no_fresh:
        print(f"import fusegraph {import_s('fusegraph') * 1e3:.0f} ms, import onnxruntime "
              f"{import_s('onnxruntime') * 1e3:.0f} ms (fresh processes, in no column below)\n")
    head = "| model | compile ms | .fgm load ms | load / compile | ORT session ms | load / ORT |"
    rule = "|---|---:|---:|---:|---:|---:|"
    if not args.no_fresh:
        head += (" fresh: .fgm load ms | first run ms | run ms | fresh: ORT session ms | ORT first run ms "
                 "| ORT run ms |")
        rule += "---:|---:|---:|---:|---:|---:|"
    print(head)
    print(rule)
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
            row = (f"| {name} | {compile_s * 1e3:.0f} | {load_s * 1e3:.0f} | {load_s / compile_s:.0%} | "
                   f"{ort_s * 1e3:.0f} | {load_s / ort_s:.2f} |")
            if not args.no_fresh:
                f, o = fresh("fusegraph", fgm, onnx_path), fresh("onnxruntime", fgm, onnx_path)
                row += "".join(f" {d[k] * 1e3:.0f} |" for d in (f, o) for k in ("load", "first", "run"))
            print(row, flush=True)
    print(f"\nfinished {time.strftime('%H:%M:%S UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
