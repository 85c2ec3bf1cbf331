"""Dynamic-axis exports against the same model compiled with static shapes, and onnxruntime.

For each ONNX file with dynamic (batch, sequence) inputs (the BERT / GPT-2 exports of
``tests/model_builders.py``) and each sequence length:

- latency: the dynamic model (``fg.compile(path)``; its runs take the compile at their exact
  shapes, ``specialize.py``), the same export with its input dims fixed (``static_shapes``), a
  second compile of that static model (its twin: what two identical models differ by, the
  noise floor of the ratio) and an onnxruntime session on the dynamic export, in one process,
  alternating blocks, median of ``--runs`` runs after a warm-up (``fusegraph.tools.bench.alternate``:
  a pause before each block so onnxruntime's spinning pool does not tax the next engine); the
  first run at a shape, which compiles, is timed apart;
- the first run at each length (ms): the dynamic model's per-shape compile plus its run;
- memory and load (``--memory``): RssAnon after runs at every length, minus after import, one
  fresh process per engine: the dynamic model compiled and its ``.fgm`` loaded, the static
  model at the longest length only (compiled, and loaded), and onnxruntime's session on the
  dynamic export; beside each, its build time (compile, ``fg.load``, session creation).

2 threads. ``python benchmarks/dynamic_shapes.py --models /tmp/dyn/bert.onnx,/tmp/dyn/gpt2.onnx
--seqs 8,64,128,384 --runs 30 --memory``
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
engine, path, seqs = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) / 1024
import numpy as np, torch
import fusegraph as fg, onnxruntime as ort
from model_builders import transformer_feeds, static_shapes
base = rss()
t = time.perf_counter()
if engine == "static":
    model = fg.compile(static_shapes(path, 1, max(seqs)), fg.Config(threads=2)); run = model.run
elif engine.endswith("load"):           # path: the .fgm the parent saved
    model = fg.load(path); run = model.run
elif engine == "dynamic":
    model = fg.compile(path, fg.Config(threads=2)); run = model.run
else:
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    run = lambda f: sess.run(None, f)
build = time.perf_counter() - t
if engine.startswith("static"):
    seqs = [max(seqs)]
for s in seqs:
    for _ in range(5):
        run(transformer_feeds(0, 1, s))
print(json.dumps({"build_s": build, "rss_mib": rss() - base}))
"""


def _latency(path: str, seqs: list[int], runs: int) -> list[dict]:
    import onnxruntime as ort
    import torch
    import fusegraph as fg
    from fusegraph.tools.bench import alternate
    from model_builders import static_shapes, transformer_feeds
    torch.set_num_threads(2)
    dynamic = fg.compile(path, fg.Config(threads=2))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rows = []
    for seq in seqs:
        feeds = transformer_feeds(0, 1, seq)
        t = time.perf_counter()
        first = dynamic.run(feeds)
        first_ms = (time.perf_counter() - t) * 1e3
        static = fg.compile(static_shapes(path, 1, seq), fg.Config(threads=2))
        twin = fg.compile(static_shapes(path, 1, seq), fg.Config(threads=2))   # the noise floor
        want = sess.run(None, feeds)[0]
        err = float(np.abs(first["last_hidden_state"] - want).max() / np.abs(want).max())
        engines = {"dynamic": lambda: dynamic.run(feeds), "static": lambda: static.run(feeds),
                   "twin": lambda: twin.run(feeds), "onnxruntime": lambda: sess.run(None, feeds)}
        samples = alternate(engines, runs=runs)   # blocks, with a pause for spinning pools
        med = {k: statistics.median(v) for k, v in samples.items()}
        record = dynamic.specializations.compiled[-1]
        rows.append({"seq": seq, **{f"{k}_ms": v for k, v in med.items()}, "first_run_ms": first_ms,
                     "compile_s": record["seconds"], "unplannable": record["unplannable"],
                     "arena_over_bound": record["arena_bytes"] / max(record["lower_bound_bytes"], 1),
                     "max_rel_err_vs_ort": err})
        static = twin = None        # the next length compiles its own
    return rows


def _memory(path: str, seqs: list[int]) -> dict:
    import fusegraph as fg
    from model_builders import static_shapes
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"dynamic load": Path(tmp) / "dynamic.fgm", "static load": Path(tmp) / "static.fgm"}
        fg.compile(path, fg.Config(threads=2)).save(files["dynamic load"])
        fg.compile(static_shapes(path, 1, max(seqs)), fg.Config(threads=2)).save(files["static load"])
        for engine in ("dynamic", "dynamic load", "static", "static load", "onnxruntime"):
            got = subprocess.run([sys.executable, "-c", _CHILD, engine, str(files.get(engine, path)),
                                  ",".join(map(str, seqs)), str(ROOT / "tests")],
                                 capture_output=True, text=True, check=True)
            out[engine] = json.loads(got.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--seqs", default="8,64,128,384")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--memory", action="store_true")
    args = ap.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    for path in args.models.split(","):
        print(f"\n{path}")
        print(f"{'seq':>5} {'dynamic ms':>11} {'static ms':>10} {'ORT ms':>8} {'dyn/static':>10} "
              f"{'twin/static':>11} {'dyn/ORT':>8} {'first run ms':>12} {'unplannable':>11} {'arena/bound':>11} {'err vs ORT':>10}")
        for r in _latency(path, seqs, args.runs):
            print(f"{r['seq']:>5} {r['dynamic_ms']:>11.2f} {r['static_ms']:>10.2f} {r['onnxruntime_ms']:>8.2f} "
                  f"{r['dynamic_ms'] / r['static_ms']:>10.3f} {r['twin_ms'] / r['static_ms']:>11.3f} "
                  f"{r['dynamic_ms'] / r['onnxruntime_ms']:>8.3f} "
                  f"{r['first_run_ms']:>12.1f} {r['unplannable']:>11} {r['arena_over_bound']:>11.3f} "
                  f"{r['max_rel_err_vs_ort']:>10.1e}")
        if args.memory:
            mem = _memory(path, seqs)
            print(f"RssAnon MiB after runs at {args.seqs} (static: at {max(seqs)} only) / build or load s: "
                  + ", ".join(f"{k} {v['rss_mib']:.0f} MiB / {v['build_s']:.2f} s" for k, v in mem.items()))


if __name__ == "__main__":
    main()
