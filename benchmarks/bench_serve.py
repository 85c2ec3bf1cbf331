"""Load test of ``fusegraph serve`` on loopback: 8 concurrent gRPC clients send 5 000 requests
(bounded in count and in time), every answer is checked against ``model.run``; p50 / p99
latency, throughput, and the server's private memory (RssAnon, peak of samples and at the end).

    python benchmarks/bench_serve.py [--models resnet50,bert] [--requests 5000] [--clients 8]
                                     [--max-seconds 300] [--json out.json]

Three server setups per model, at the same concurrency:
  single:    1 instance x all cores' threads, no dynamic batching (max_batch_size 0)
  instances: 2 instances x (cores / 2) threads, no dynamic batching
  batched: 2 instances x (cores / 2) threads, dynamic batching (max_batch_size 8, 5 ms window),
           static-shape batch sizes compiled at start (warmup = true)
Inputs are batch-1 requests drawn from a pool of 16 random inputs whose reference outputs come
from ``model.run`` in this process: bitwise without batching, rtol 1e-4 / atol 1e-5 with it (a
row of a batch differs in the last bits: oneDNN's GEMM blocking depends on the row count, and a
static model's batch-size variant is a compilation of its own). A request that fails, times out
or is not answered counts as lost; an answer that differs counts as wrong. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx

import fusegraph as fg
from fusegraph.testing import zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))
from serve_helpers import ServerProcess, feeds_for  # noqa: E402

SETUPS = {
    "single": "instances = 1\nmax_batch_size = 0\n",
    "instances": "instances = 2\nmax_batch_size = 0\n",
    "batched": "instances = 2\nmax_batch_size = 8\nmax_queue_delay_ms = 5\nwarmup = true\n",
}


def build_model(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if name == "bert":
        from model_builders import build_transformer_models
        return build_transformer_models(folder)["bert"]
    path = folder / f"{name}.onnx"
    onnx.save(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0), str(path))
    return path


def rss_anon_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def server_batches(server: ServerProcess, name: str) -> dict:
    """From the server's ``/metrics``: executed batches, mean rows per batch, mean compute
    seconds per batch (warm-up requests included)."""
    import urllib.request
    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10).read().decode()
    got = {}
    for line in text.splitlines():
        for metric in ("fusegraph_batch_size_count", "fusegraph_batch_size_sum", "fusegraph_compute_seconds_sum"):
            if line.startswith(metric + "{") and f'model="{name}"' in line:
                got[metric] = float(line.rsplit(" ", 1)[1])
    count = got.get("fusegraph_batch_size_count", 0.0)
    return {"batches": int(count),
            "mean_batch": round(got.get("fusegraph_batch_size_sum", 0.0) / count, 2) if count else None,
            "mean_compute_ms": round(1000 * got.get("fusegraph_compute_seconds_sum", 0.0) / count, 1) if count else None}


def load_test(server: ServerProcess, name: str, pool: list, refs: list, exact: bool, requests: int,
              clients: int, max_seconds: float) -> dict:
    import tritonclient.grpc as tg
    lock = threading.Lock()
    state = {"next": 0, "lost": 0, "wrong": 0, "errors": []}
    latencies: list[float] = []
    deadline = time.monotonic() + max_seconds

    def client(seed: int):
        c = tg.InferenceServerClient(server.grpc)
        rng = np.random.default_rng(seed)
        while True:
            with lock:
                if state["next"] >= requests or time.monotonic() > deadline:
                    return
                state["next"] += 1
            k = int(rng.integers(len(pool)))
            inputs = []
            for n, v in pool[k].items():
                inp = tg.InferInput(n, list(v.shape), tg.np_to_triton_dtype(v.dtype))
                inp.set_data_from_numpy(v)
                inputs.append(inp)
            t0 = time.perf_counter()
            try:
                result = c.infer(name, inputs, client_timeout=60)
            except Exception as exc:  # noqa: BLE001 - counted, never fatal
                with lock:
                    state["lost"] += 1
                    state["errors"].append(str(exc)[:200])
                continue
            dt = time.perf_counter() - t0
            ok = True
            for out, want in refs[k].items():
                got = result.as_numpy(out)
                ok &= got is not None and got.shape == want.shape and (
                    np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-4, atol=1e-5))
            with lock:
                latencies.append(dt)
                state["wrong"] += 0 if ok else 1

    for warm in range(2 * clients):  # connections and first runs, not timed
        c = tg.InferenceServerClient(server.grpc)
        inputs = []
        for n, v in pool[warm % len(pool)].items():
            inp = tg.InferInput(n, list(v.shape), tg.np_to_triton_dtype(v.dtype))
            inp.set_data_from_numpy(v)
            inputs.append(inp)
        c.infer(name, inputs, client_timeout=120)
    peak = [rss_anon_mib(server.proc.pid)]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.2):
            peak.append(rss_anon_mib(server.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max_seconds + 120)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join(5)
    lat = np.array(latencies) * 1000
    batches = server_batches(server, name)
    return {**batches, "requests": state["next"], "answered": len(latencies), "lost": state["lost"], "wrong": state["wrong"],
            "wall_s": round(wall, 2), "throughput_rps": round(len(latencies) / wall, 2),
            "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
            "rss_anon_mib_peak": round(max(peak), 1), "rss_anon_mib_end": round(rss_anon_mib(server.proc.pid), 1),
            "errors": state["errors"][:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=300.0, help="cap per load test")
    ap.add_argument("--setups", default="single,instances,batched")
    ap.add_argument("--max-batch", type=int, default=8, help="batched setup: max_batch_size")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="batched setup: max_queue_delay_ms")
    ap.add_argument("--batch-sizes", default="", help="batched setup: compiled sizes, e.g. 1,4,8")
    ap.add_argument("--json")
    args = ap.parse_args()
    cpus = os.cpu_count() or 1
    SETUPS["batched"] = (f"instances = 2\nmax_batch_size = {args.max_batch}\nmax_queue_delay_ms = {args.delay_ms}\n"
                         f"warmup = true\n" + (f"batch_sizes = [{args.batch_sizes}]\n" if args.batch_sizes else ""))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            source = build_model(name, Path(tmp) / "src" / name)
            threads_single, threads_batched = cpus, max(1, cpus // 2)
            import torch
            torch.set_num_threads(threads_single)
            ref_model = fg.compile(str(source), config=fg.Config(threads=threads_single))
            pool = [feeds_for(ref_model, seed=i) for i in range(16)]
            for setup in args.setups.split(","):
                threads = threads_single if setup == "single" else threads_batched
                torch.set_num_threads(threads)
                ref = fg.compile(str(source), config=fg.Config(threads=threads))
                refs = [ref.run(f) for f in pool]
                repo = Path(tmp) / f"repo-{name}-{setup}"
                (repo / name).mkdir(parents=True)
                (repo / name / "model.onnx").write_bytes(Path(source).read_bytes())
                (repo / name / "config.toml").write_text(SETUPS[setup] + f"threads = {threads}\n")
                server = ServerProcess(repo, start_timeout=300)
                try:
                    row = load_test(server, name, pool, refs, setup != "batched",
                                    args.requests, args.clients, args.max_seconds)
                finally:
                    code = server.stop(60)
                row.update(model=name, setup=setup, threads=threads, exit_code=code)
                print(json.dumps(row), flush=True)
                results.append(row)
    print("\n| model | setup | requests | lost | wrong | p50 ms | p99 ms | req/s | RssAnon peak MiB | rows/batch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['model']} | {r['setup']} | {r['answered']} | {r['lost']} | {r['wrong']} | {r['p50_ms']} | "
              f"{r['p99_ms']} | {r['throughput_rps']} | {r['rss_anon_mib_peak']} | {r['mean_batch']} |")
    for name in args.models.split(","):
        by = {r["setup"]: r for r in results if r["model"] == name}
        for other in ("instances", "batched"):
            if "single" in by and other in by and by["single"]["throughput_rps"]:
                print(f"{name}: {other} / single throughput = "
                      f"{by[other]['throughput_rps'] / by['single']['throughput_rps']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
