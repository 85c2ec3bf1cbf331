"""fusegraph and onnxruntime under a noisy neighbour: latency with every core free, and with a
second process keeping one core busy (issue 39 #16).

Per model and engine, a fresh child process compiles (fusegraph: ``Config(threads=T,
thread_policy=P)``, once with ``fixed`` (every run at T threads, what it did before) and once
with ``free_cores`` (the default: at most the cores others leave free); onnxruntime:
ORT_ENABLE_ALL with T intra-op threads), warms up, and times ``--runs`` runs, first quiet, then with a neighbour (a process
spinning on one core, started by the parent and stopped after); the children run one at a
time under the benchmark lock. Printed per model and engine: the quiet median, the median
with the neighbour, their ratio (how much the engine degrades), the process's RssAnon after
its runs, and its build time. A table line starts with the CPU model and its flags.

    python benchmarks/noisy_neighbour.py [--threads 2|default] [--runs 40] [--models 'a.onnx;b.onnx@seq=128']

Models default to three of the onnx package's light models; a model's symbolic dims are given
after ``@`` (``bert.onnx@seq=128,batch=1``; others 1).
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

CHILD = r"""
import json, os, sys, time
spec = json.loads(open(sys.argv[1]).read())
import numpy as np
import fusegraph as fg
from fusegraph.tools.bench import random_feeds_for, ort_runner
threads = None if spec["threads"] == "default" else int(spec["threads"])
t0 = time.perf_counter()
model = fg.compile(spec["model"], fg.Config(threads=threads, thread_policy=spec["policy"]))
feeds = random_feeds_for(model, dims=spec.get("dims") or None)
if spec["engine"] == "onnxruntime":
    t0 = time.perf_counter()
    fn = ort_runner(spec["model"], threads or os.cpu_count(), feeds)
    fn()
    del model
build = time.perf_counter() - t0
if spec["engine"] == "fusegraph":
    fn = lambda: model.run(feeds)
    fn()
out = {"build_s": build}
used = {}
for phase in ("quiet", "neighbour"):
    open(spec["ready"] + "." + phase, "w").close()
    while not os.path.exists(spec["go"] + "." + phase):
        time.sleep(0.01)
    for _ in range(3):
        fn()
    times = []
    for _ in range(spec["runs"]):
        t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e3)
    out[phase] = times
    if spec["engine"] == "fusegraph":
        used[phase] = model.threads_used
out["threads_used"] = used
with open("/proc/self/status") as f:
    out["rss_anon_mib"] = next(int(l.split()[1]) for l in f if l.startswith("RssAnon")) / 1024
open(spec["out"], "w").write(json.dumps(out))
"""

SPIN = "import time\nwhile True:\n    pass\n"


def machine_line() -> str:
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    shown = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(shown)}; load {os.getloadavg()[0]:.2f} before"


def default_models() -> list[tuple[str, dict]]:
    from fusegraph.testing.zoo import light_model_path
    return [(str(light_model_path(n)), {}) for n in ("squeezenet", "resnet50", "inception_v1")]


def parse_model(text: str) -> tuple[str, dict]:
    path, _, dims = text.partition("@")
    return path, {k: int(v) for k, v in (d.split("=") for d in dims.split(",") if d)}


def run_child(engine: str, model: str, dims: dict, threads: str, runs: int, policy: str = "fixed") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"engine": engine, "model": model, "dims": dims, "threads": threads, "runs": runs, "policy": policy,
                "ready": f"{tmp}/ready", "go": f"{tmp}/go", "out": f"{tmp}/out.json"}
        Path(f"{tmp}/spec.json").write_text(json.dumps(spec))
        child = subprocess.Popen([sys.executable, "-c", CHILD, f"{tmp}/spec.json"])
        spinner = None
        try:
            for phase in ("quiet", "neighbour"):
                while not os.path.exists(f"{spec['ready']}.{phase}"):
                    if child.poll() is not None:
                        raise RuntimeError(f"{engine} on {model} exited with {child.returncode}")
                    time.sleep(0.01)
                if phase == "neighbour":
                    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
                    time.sleep(1.0)                    # the neighbour is on a core before the runs
                Path(f"{spec['go']}.{phase}").touch()
            if child.wait() != 0:
                raise RuntimeError(f"{engine} on {model} exited with {child.returncode}")
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
            if child.poll() is None:
                child.kill()
        return json.loads(Path(spec["out"]).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="2", help="intra-op threads of both engines, or 'default' "
                                                   "(fusegraph: torch's count; onnxruntime: every core)")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--models", help="';'-separated .onnx paths, each with @dim=size,... (default: three light models)")
    args = ap.parse_args()
    models = [parse_model(m) for m in args.models.split(";")] if args.models else default_models()
    print(machine_line())
    print(f"threads {args.threads}, {args.runs} runs per phase, medians in ms\n")
    print("| model | engine | quiet ms | one core busy ms | busy / quiet | threads (quiet; busy) | RssAnon MiB | build s |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for model, dims in models:
        for engine, policy in (("fusegraph", "fixed"), ("fusegraph", "free_cores"), ("onnxruntime", "")):
            r = run_child(engine, model, dims, args.threads, args.runs, policy or "fixed")
            quiet, busy = statistics.median(r["quiet"]), statistics.median(r["neighbour"])
            used = r.get("threads_used") or {}
            shown = "; ".join(",".join(f"{k}x{v}" for k, v in sorted(used.get(p, {}).items())) or "-"
                              for p in ("quiet", "neighbour")) if engine == "fusegraph" else "-"
            name = f"{engine} {policy}".strip()
            print(f"| {Path(model).stem} | {name} | {quiet:.2f} | {busy:.2f} | {busy / quiet:.2f} | {shown} | "
                  f"{r['rss_anon_mib']:.0f} | {r['build_s']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
