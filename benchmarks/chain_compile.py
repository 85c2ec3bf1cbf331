"""Compile time of long elementwise chains (issue 39 #12): ``fg.compile`` of a chain of ``n``
Add / Mul / Sub / Div nodes by constants (the links of ``tests/passes/test_chain_scaling.py``),
the seconds ``algebraic_simplify`` took of it, the run latency of the result, the RssAnon the
compile added, beside onnxruntime's session creation (ORT_ENABLE_ALL) and run on the same file.
Each size runs in a fresh process per engine (2 threads), so the memory column is the
compile's own.

    python benchmarks/chain_compile.py [--sizes 1250,2500,5000,10000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, statistics, sys, time
engine, path = sys.argv[1:3]
import numpy as np, torch
torch.set_num_threads(2)
def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
x = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
if engine == "fusegraph":
    import fusegraph as fg
    before = anon()
    t0 = time.perf_counter(); m = fg.compile(path, fg.Config(threads=2)); build = time.perf_counter() - t0
    simplify = sum(p.seconds for p in m.report.passes if p.name == "algebraic_simplify")
    run = m.run
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 2
    before = anon()
    t0 = time.perf_counter(); s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    build = time.perf_counter() - t0
    simplify = None
    run = lambda f: s.run(None, f)
run(x)
lat = []
for _ in range(20):
    t0 = time.perf_counter(); run(x); lat.append(time.perf_counter() - t0)
print(json.dumps({"build_s": build, "simplify_s": simplify, "run_us": statistics.median(lat) * 1e6,
                  "anon_mib": (anon() - before) / 1024}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1250,2500,5000,10000")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "passes"))
    import onnx
    from test_chain_scaling import affine_chain
    print("| links | fusegraph compile s | of it algebraic_simplify s | fusegraph run us | fusegraph compile "
          "RssAnon MiB | onnxruntime session s | onnxruntime run us | onnxruntime RssAnon MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            path = Path(tmp) / f"chain{n}.onnx"
            onnx.save(affine_chain(n), str(path))
            got = {}
            for engine in ("fusegraph", "onnxruntime"):
                out = subprocess.run([sys.executable, "-c", _CHILD, engine, str(path)], capture_output=True,
                                     text=True, check=True)
                got[engine] = json.loads(out.stdout.strip().splitlines()[-1])
            f, o = got["fusegraph"], got["onnxruntime"]
            print(f"| {n} | {f['build_s']:.2f} | {f['simplify_s']:.2f} | {f['run_us']:.0f} | {f['anon_mib']:.0f} | "
                  f"{o['build_s']:.2f} | {o['run_us']:.0f} | {o['anon_mib']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
