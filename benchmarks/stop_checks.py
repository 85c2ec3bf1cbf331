"""What reading the stop flag before each kernel costs (issue 39 #1): one compiled model per
model, its run function generated with the checks (``if _RC.stop: _RC.stopped()`` before each
call, what every run executes) and without them, timed in alternating blocks in one process
(``fusegraph.tools.bench.alternate``) beside onnxruntime (ORT_ENABLE_ALL) on the same file; 2 threads,
batch 1, random weights (``zoo.randomize_weights`` seed 0); the two variants' outputs compared
bit for bit. Also the compile and session-creation times and the process's RssAnon after each
model (what the checks add to memory: nothing measurable; the column is there to show it).

    python benchmarks/stop_checks.py [--models mlp,squeezenet,resnet50,bert,gpt2] [--runs 100]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import fusegraph as fg
from fusegraph.tools.bench import alternate, random_feeds_for
from fusegraph.runtime.codegen import generate_run_function
from fusegraph.runtime.feeds import convert_feeds

THREADS = 2


def rss_anon_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


def _mlp(folder: Path) -> Path:
    import onnx
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))
    from small_models import mlp
    path = folder / "mlp.onnx"
    onnx.save(mlp(batch=1), str(path))
    return path


def row(name: str, path: Path, runs: int) -> str:
    import onnxruntime as ort
    t0 = time.perf_counter()
    compiled = fg.compile(str(path), fg.Config(threads=THREADS))
    compile_s = time.perf_counter() - t0
    feeds = random_feeds_for(compiled, dims={"seq": 128} if name in ("bert", "gpt2") else None)
    if name in ("bert", "gpt2"):
        feeds["input_ids"] = np.random.default_rng(0).integers(0, 1000, feeds["input_ids"].shape).astype(np.int64)
        feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
    model = compiled.runs_as(feeds)          # a dynamic model's compile at these shapes
    model.run(feeds)
    ex = model._executor
    tensors = convert_feeds(ex.model_name, ex.inputs, feeds)
    with_checks = generate_run_function(ex.graph, ex.binding, "<checks>", control=ex.control)
    without = generate_run_function(ex.graph, ex.binding, "<plain>")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = THREADS
    t0 = time.perf_counter()
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ort_s = time.perf_counter() - t0

    def runner(code):
        def run():
            with torch.inference_mode():
                ex.backend.before_run(tensors)
                return [t.clone() for t in code.function(*tensors)]
        return run
    torch.set_num_threads(THREADS)
    a, b = runner(without)(), runner(with_checks)()
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    times = alternate({"plain": runner(without), "checks": runner(with_checks),
                       "ort": lambda: session.run(None, feeds)}, runs=runs)
    med = {k: statistics.median(v) for k, v in times.items()}
    return (f"| {name} | {len(ex.binding.calls)} | {med['plain']:.4f} | {med['checks']:.4f} | "
            f"{med['checks'] / med['plain']:.3f} | {med['ort']:.4f} | {compile_s:.2f} / {ort_s:.2f} | "
            f"{rss_anon_mib():.0f} | {'yes' if same else 'NO'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,squeezenet,resnet50,bert,gpt2")
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from bench_latency import model_files
    names = args.models.split(",")
    print("| model | kernels | without checks ms | with checks ms | with / without | onnxruntime ms | "
          "compile s / ORT session s | RssAnon MiB | equal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        files = model_files(Path(tmp), [n for n in names if n != "mlp"])
        if "mlp" in names:
            files = {"mlp": _mlp(Path(tmp)), **files}
        for name in names:
            print(row(name, files[name], args.runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
