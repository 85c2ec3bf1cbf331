"""Private resident memory (RssAnon) and load time, fresh process per engine and model.

For each light model (random weights) and engine, a new Python process imports its engine,
reads /proc/self/status, builds the model (``fg.compile(onnx)``, ``fg.load(fgm)`` or an
onnxruntime ORT_ENABLE_ALL session), runs it 20 times, and reads /proc/self/status again.
Columns: build seconds, the first run (ms: a loaded model compiles its kernels there), the
median of runs 6..20 (ms; a fresh process each, so for latency ratios prefer ``fusegraph
bench``, which alternates engines in one process), RssAnon after 20 runs minus after import
(MiB), and RssFile beside it (file-backed pages: a memory map counts there, not in RssAnon).
2 threads. ``--extra`` adds ONNX files (random weights already) by path: the BERT / GPT-2 /
MobileNetV2 exports of ``tests/model_builders.py``. ``--repeat N`` (default 3) measures each
engine N times, the engines taking turns, and gives each column's median: one fresh process
is one sample, and a load of tens of milliseconds moves by a third from one to the next.

    python benchmarks/private_memory.py [--models squeezenet,resnet50] [--engines compile,load,ort] [--extra a.onnx] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from fusegraph.testing import zoo

_CHILD = r"""
import json, sys, time
engine, path = sys.argv[1:3]
def status():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024
    return out
import numpy as np
if engine == "ort":
    import onnxruntime as ort
else:
    import torch, fusegraph as fg
    torch.set_num_threads(2)
base = status()
t0 = time.perf_counter()
if engine == "ort":
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    specs = [(i.name, i.shape, "int" in i.type) for i in s.get_inputs()]
    run = lambda f: s.run(None, f)
else:
    m = fg.load(path) if engine == "load" else fg.compile(path, config=fg.Config(threads=2))
    specs = [(v.name, v.shape, not v.dtype.to_torch().is_floating_point) for v in m.inputs]
    run = m.run
build = time.perf_counter() - t0
rng = np.random.default_rng(0)
feeds = {n: rng.integers(1, 100, tuple(int(d) for d in sh)).astype(np.int64) if is_int
         else rng.random(tuple(int(d) for d in sh), dtype=np.float32) for n, sh, is_int in specs}
times = []
t = time.perf_counter(); run(feeds); first_ms = (time.perf_counter() - t) * 1e3
for _ in range(19):
    t = time.perf_counter(); run(feeds); times.append(time.perf_counter() - t)
end = status()
run_ms = sorted(times[4:])[len(times[4:]) // 2] * 1e3
print(json.dumps({"build_s": build, "first_ms": first_ms, "run_ms": run_ms, "anon": end["RssAnon"] - base["RssAnon"],
                  "file": end["RssFile"] - base["RssFile"]}))
"""


def measure(engine: str, path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, engine, path], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--engines", default="compile,load,ort")
    ap.add_argument("--extra", default="", help="ONNX files to add, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per engine and model (median)")
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    print("| model | " + " | ".join(f"{e} build s | {e} first ms | {e} run ms | {e} RssAnon MiB | {e} RssFile MiB"
                                    for e in engines) + " |")
    print("|---|" + "---:|" * (5 * len(engines)))
    with tempfile.TemporaryDirectory() as tmp:
        import fusegraph as fg
        names = [n for n in args.models.split(",") if n] + [n for n in args.extra.split(",") if n]
        for name in names:
            if name.endswith(".onnx"):
                onnx_path, name = name, Path(name).stem
            else:
                proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)
                onnx_path = str(Path(tmp) / f"{name}.onnx")
                onnx.save(proto, onnx_path)
            fgm = str(Path(tmp) / f"{name}.fgm")
            if "load" in engines:
                fg.compile(onnx_path, config=fg.Config(threads=2)).save(fgm)
            samples = {e: [] for e in engines}
            for _ in range(args.repeat):
                for e in engines:
                    samples[e].append(measure(e, fgm if e == "load" else onnx_path))
            cells = []
            for e in engines:
                r = {k: statistics.median(x[k] for x in samples[e]) for k in samples[e][0]}
                cells += [f"{r['build_s']:.3f}", f"{r['first_ms']:.1f}", f"{r['run_ms']:.2f}", f"{r['anon']:.0f}",
                          f"{r['file']:.0f}"]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
