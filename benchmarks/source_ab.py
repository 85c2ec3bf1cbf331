"""Fresh-process A/B of fusegraph source trees on model files: each round runs every tree (and
the peers asked for) in its own new process, in turn, so that a change is measured against the
code before it on the same machine in the same minutes.

    python benchmarks/source_ab.py --srcs /tmp/before/src,src --models a.onnx,b.onnx \
        [--precision bf16] [--rounds 4] [--peers ov,ort]

A process compiles the model (``fg.compile``, 2 threads, the precision given), runs it 10
times, then times 40 runs on one random input (float inputs standard normal, integer ones in
0..99, symbolic dims 1) and prints the median; the table gives each tree's and peer's median
over rounds and every round's value. ``ov``: OpenVINO at the same inference precision
(``f32`` / ``bf16``), ``ort``: onnxruntime ORT_ENABLE_ALL (float32). A tree is chosen by
``PYTHONPATH`` (it must hold ``fusegraph/``; compile its modules first, ``python -m compileall
-q``, where bytecode is not written); a failing engine prints ``nan``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import json, statistics, sys, time
import numpy as np
import onnx
path, engine, precision = sys.argv[1:4]
m = onnx.load(path, load_external_data=False)
rng = np.random.default_rng(0)
feeds = {}
for i in m.graph.input:
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
    floating = i.type.tensor_type.elem_type == 1
    feeds[i.name] = rng.standard_normal(shape).astype(np.float32) if floating else rng.integers(0, 100, shape)
if engine == "ov":
    import openvino as ov
    hint = "f32" if precision == "fp32" else precision
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": 2,
                                                      "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    run = lambda: request.infer(feeds, share_inputs=True)
elif engine == "ort":
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, feeds)
else:
    import fusegraph as fg
    model = fg.compile(path, fg.Config(threads=2, precision=precision))
    run = lambda: model.run(feeds)
for _ in range(10):
    run()
times = []
for _ in range(40):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times) * 1e3))
'''


def _one(model: str, engine: str, precision: str, src: str | None) -> float:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    done = subprocess.run([sys.executable, "-c", CHILD, model, engine, precision], env=env,
                          capture_output=True, text=True)
    try:
        return float(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--srcs", required=True, help="comma-separated source trees (each holds fusegraph/)")
    ap.add_argument("--models", required=True, help="comma-separated ONNX files")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--peers", default="", help="comma-separated: ov, ort")
    args = ap.parse_args()
    srcs, models = args.srcs.split(","), args.models.split(",")
    peers = [p for p in args.peers.split(",") if p]
    got: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for model in models:
            for src in srcs:
                got.setdefault((model, f"fusegraph {src}"), []).append(_one(model, "fg", args.precision, src))
            for peer in peers:
                got.setdefault((model, peer), []).append(_one(model, peer, args.precision, None))
    print(f"| model | engine | median ms ({args.precision}) | rounds |")
    print("|---|---|---:|---|")
    for (model, engine), values in got.items():
        print(f"| {os.path.basename(model)} | {engine} | {statistics.median(values):.2f} | "
              f"{' '.join(f'{v:.2f}' for v in values)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
