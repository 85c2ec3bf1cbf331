"""Where a model's run goes: every kernel timed inside the run and alone, and onnxruntime's profile.

Inside the run, a debug hook times each kernel (``model.run(feeds, hook=...)``; this variant
runs every node, shape-only ones included). Alone, each kernel is called repeatedly on inputs
captured from a run. With ``--ort``, onnxruntime's own node profile (ORT_ENABLE_ALL) of the
same model and inputs, grouped by op type; with ``--openvino PRECISION``, OpenVINO's
(``PERF_COUNT``); ``--cold`` reads 256 MiB before every timed run. Random-weight light models
and the BERT / GPT-2 exports, as in ``bench_latency.py``; batch 1, medians.

    python benchmarks/profile_nodes.py MODEL|FILE.onnx [--threads 2] [--top 25] [--ort] [--precision bf16]
                                             [--openvino bf16] [--cold]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fusegraph.tools.timing import measure


def _median_us(fn) -> float:
    return measure(fn, runs=30, warmup=5).median_ms * 1000.0


_EVICT = None


def evict_caches(cold: bool) -> None:
    """With ``cold``, read a buffer larger than the last-level cache: the next run starts with
    its weights and activations in memory, as when other work ran in between (read, not
    written: no dirty lines left to write back during the run)."""
    global _EVICT
    if cold:
        if _EVICT is None:
            _EVICT = torch.ones(64 << 20, dtype=torch.float32)
        _EVICT.max()


def profile(model, feeds, cold: bool = False) -> list[tuple[str, str, float, float]]:
    """[(op, node, us inside the run, us alone)] in execution order."""
    ex = model._executor
    calls = ex.binding.calls
    values = {id(v): torch.from_numpy(feeds[v.name]) for v in ex.inputs}

    def capture(i, phase, outs):
        if phase == 1:
            for v, t in zip(calls[i].node.outputs, outs):
                values[id(v)] = t.clone() if isinstance(t, torch.Tensor) else t
    model.run(feeds, hook=capture)

    def arg(v):
        if v is None:
            return None
        return ex.binding.dense.get(id(v), v.const) if v.is_const else values[id(v)]
    alone = []
    for c in calls:
        args = [arg(v) for v in c.inputs]
        kw = {"out": c.out[0] if len(c.out) == 1 else c.out} if c.out is not None else {}
        with torch.inference_mode():          # as the executor calls its kernels
            alone.append(_median_us(lambda: c.kernel(*args, **kw)))
    spans: dict[int, list[float]] = {}
    start: dict[int, float] = {}

    def timing(i, phase, outs):
        if phase == 0:
            start[i] = time.perf_counter()
        else:
            spans.setdefault(i, []).append((time.perf_counter() - start[i]) * 1e6)
    for n in range(25):
        if n == 5:
            spans.clear()
        evict_caches(cold)
        model.run(feeds, hook=timing)
    return [(c.node.op_type, c.node.name, statistics.median(spans[i]), alone[i]) for i, c in enumerate(calls)]


def ort_profile(path: str, feeds, threads: int) -> dict[str, list[float]]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(30):
        sess.run(None, feeds)
    events = json.load(open(sess.end_profiling()))
    per_node: dict[tuple[str, str], list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node.setdefault((e["args"]["op_name"], e["name"]), []).append(e["dur"])
    by_op: dict[str, list[float]] = {}
    for (op, _), durs in per_node.items():
        by_op.setdefault(op, []).append(statistics.median(durs))
    return by_op


def openvino_profile(path: str, feeds, threads: int, precision: str,
                     cold: bool = False) -> list[tuple[str, str, float]]:
    """OpenVINO's own per-node profile (``PERF_COUNT``): [(node type, node name, us)], median of 30 runs."""
    import openvino as ov
    compiled = ov.Core().compile_model(path, "CPU", {
        "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True})
    request = compiled.create_infer_request()
    per_node: dict[tuple[str, str], list[float]] = {}
    for n in range(35):
        evict_caches(cold)
        request.infer(feeds)
        if n >= 5:
            for info in request.profiling_info:
                if info.status == info.Status.EXECUTED:
                    per_node.setdefault((info.node_type, info.node_name), []).append(
                        info.real_time.total_seconds() * 1e6)
    return [(op, name, statistics.median(us)) for (op, name), us in per_node.items()]


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_latency import model_files
    import fusegraph as fg
    from fusegraph.tools.bench import random_feeds_for

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ort", action="store_true")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--cold", action="store_true", help="evict the caches before every timed run")
    ap.add_argument("--openvino", metavar="PRECISION", help="OpenVINO's node profile too (f32 | bf16)")
    args = ap.parse_args()
    if args.model.endswith(".onnx") and Path(args.model).is_file():
        path = args.model                   # any static-shape file: a zoo export, for one
    else:
        folder = Path(tempfile.mkdtemp())
        path = str(model_files(folder, [args.model])[args.model])
    model = fg.compile(path, fg.Config(threads=args.threads, precision=args.precision))
    feeds = random_feeds_for(model)
    rows = profile(model, feeds, args.cold)
    print(f"{args.model}, {args.precision}, {args.threads} threads: kernels inside the run "
          f"{sum(r[2] for r in rows) / 1e3:.2f} ms, alone {sum(r[3] for r in rows) / 1e3:.2f} ms\n")
    by_op: dict[str, list[float]] = {}
    for op, _, inside, alone in rows:
        acc = by_op.setdefault(op, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += inside
        acc[2] += alone
    print("| op | kernels | inside the run ms | alone ms |")
    print("|---|---:|---:|---:|")
    for op, (n, inside, alone) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
        print(f"| {op} | {n} | {inside / 1e3:.2f} | {alone / 1e3:.2f} |")
    print(f"\nlargest {args.top} (us inside / alone):")
    for op, name, inside, alone in sorted(rows, key=lambda r: -r[2])[:args.top]:
        print(f"  {inside:8.0f} {alone:8.0f}  {op} {name}")
    if args.ort:
        print("\nonnxruntime node profile (ORT_ENABLE_ALL):\n\n| op | nodes | ms |\n|---|---:|---:|")
        for op, durs in sorted(ort_profile(path, feeds, args.threads).items(), key=lambda kv: -sum(kv[1])):
            print(f"| {op} | {len(durs)} | {sum(durs) / 1e3:.2f} |")
    if args.openvino:
        rows = openvino_profile(path, feeds, args.threads, args.openvino, args.cold)
        print(f"\nOpenVINO node profile ({args.openvino}), {sum(r[2] for r in rows) / 1e3:.2f} ms:"
              "\n\n| op | nodes | ms |\n|---|---:|---:|")
        grouped: dict[str, list[float]] = {}
        for op, _, us in rows:
            grouped.setdefault(op, []).append(us)
        for op, us in sorted(grouped.items(), key=lambda kv: -sum(kv[1])):
            print(f"| {op} | {len(us)} | {sum(us) / 1e3:.2f} |")
        print(f"\nlargest {args.top} (us):")
        for op, name, us in sorted(rows, key=lambda r: -r[2])[:args.top]:
            print(f"  {us:8.0f}  {op} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
