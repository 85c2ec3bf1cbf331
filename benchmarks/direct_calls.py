"""Kernels called directly from the generated code (``runtime/direct.py``) against through their
Python path: one compiled model per model and precision, its run function generated both
ways, alternating blocks in one process (``fusegraph.tools.bench.alternate``), 2 threads, batch 1,
random weights (``zoo.randomize_weights`` seed 0); outputs compared bit for bit.

    python benchmarks/direct_calls.py [--models squeezenet,bert] [--precisions fp32,bf16] [--runs 60]
    python benchmarks/direct_calls.py --load [--models densenet121,squeezenet] [--precisions bf16] [--loads 7]

Columns: the run function's calls made directly; median latency each way and the ratio; the
time to generate the run function each way (a load makes it once); whether the outputs are
equal. ``--load``: the saved ``.fgm`` loaded in fresh processes, alternately with direct calls
and without, median over ``--loads`` processes each of the load time and of the process's
RssAnon after the load and 20 runs, less before the load. A load here is what ``fg.load``
does to a static model: ``artifact.read`` and the ``Executor`` bound from it, made with
``direct_calls`` on or off (the run functions above: ``generate_run_function(direct=...)``).
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
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.tools.bench import alternate, random_feeds_for
from fusegraph.runtime.codegen import generate_run_function
from fusegraph.runtime.feeds import convert_feeds

THREADS = 2


_CHILD = r"""
import json, sys, time
import numpy as np
from fusegraph import artifact
from fusegraph.runtime.executor import Executor
from fusegraph.runtime.threads import intra_op_threads
direct = sys.argv[2] == "1"
def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
before = anon()
t0 = time.perf_counter()
stored = artifact.read(sys.argv[1])
cfg = stored.config
with intra_op_threads(cfg.threads):
    m = Executor(stored.graph, stored.graph.name, stored.plan, device="cpu", threads=cfg.threads,
                 strides=stored.strides, keep_freed_memory=cfg.keep_freed_memory,
                 backend_state=stored.backend_state, exact=not cfg.fast_math, cpu_kernels=cfg.cpu_kernels,
                 direct_calls=direct)
load = time.perf_counter() - t0
feeds = {v.name: np.random.default_rng(0).random(tuple(int(d) for d in v.shape), dtype=np.float32)
         for v in m.inputs}
for _ in range(20):
    m.run(feeds)
print(json.dumps({"load_s": load, "anon_kib": anon() - before}))
"""


def load_row(fgm: Path, loads: int) -> str:
    got: dict[str, list[dict]] = {"0": [], "1": []}
    for _ in range(loads):
        for flag in ("1", "0"):
            out = subprocess.run([sys.executable, "-c", _CHILD, str(fgm), flag], capture_output=True,
                                 text=True, check=True)
            got[flag].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {f: {k: statistics.median(r[k] for r in rows) for k in ("load_s", "anon_kib")} for f, rows in got.items()}
    return (f"{med['0']['load_s'] * 1e3:.0f} | {med['1']['load_s'] * 1e3:.0f} | "
            f"{med['0']['anon_kib'] / 1024:.1f} | {med['1']['anon_kib'] / 1024:.1f}")


def _timed_codegen(ex, direct: bool):
    t0 = time.perf_counter()
    code = generate_run_function(ex.graph, ex.binding, f"<ab:{direct}>", direct=direct)
    return code, (time.perf_counter() - t0) * 1e3


def row(path: str, precision: str, runs: int) -> str:
    model = fg.compile(path, fg.Config(threads=THREADS, precision=precision))
    ex = model._executor
    feeds = random_feeds_for(model)
    tensors = convert_feeds(ex.model_name, ex.inputs, feeds)
    plain, plain_ms = _timed_codegen(ex, False)
    direct, direct_ms = _timed_codegen(ex, True)
    calls = direct.source.count(":= ")

    def runner(code):
        def run():
            with torch.inference_mode():
                ex.backend.before_run(tensors)
                return [t.clone() for t in code.function(*tensors)]
        return run
    a, b = runner(plain)(), runner(direct)()
    same = all(torch.equal(x, y) or (x.is_floating_point() and torch.equal(x.isnan(), y.isnan())
                                     and torch.equal(x.nan_to_num(), y.nan_to_num())) for x, y in zip(a, b))
    times = alternate({"python": runner(plain), "direct": runner(direct)}, runs=runs)
    med = {k: statistics.median(v) for k, v in times.items()}
    return (f"{calls} / {len(ex.binding.calls)} | {med['python']:.3f} | {med['direct']:.3f} | "
            f"{med['direct'] / med['python']:.3f} | {plain_ms:.1f} / {direct_ms:.1f} | "
            f"{'yes' if same else 'NO'}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(list(zoo.LIGHT_MODELS) + ["bert", "gpt2"]))
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--load", action="store_true", help="fresh-process load time and RssAnon instead")
    ap.add_argument("--loads", type=int, default=7)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_latency import model_files
    if args.load:
        print("| model | precision | load ms python / direct | RssAnon MiB python / direct |")
        print("|---|---|---:|---:|")
        with tempfile.TemporaryDirectory() as tmp:
            for name, path in model_files(Path(tmp), args.models.split(",")).items():
                for precision in args.precisions.split(","):
                    fgm = Path(tmp) / f"{name}_{precision}.fgm"
                    fg.compile(str(path), fg.Config(threads=THREADS, precision=precision)).save(fgm)
                    r = load_row(fgm, args.loads).split(" | ")
                    print(f"| {name} | {precision} | {r[0]} / {r[1]} | {r[2]} / {r[3]} |", flush=True)
        return
    print("| model | precision | direct calls | python ms | direct ms | direct / python | "
          "codegen ms python / direct | equal |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = model_files(Path(tmp), args.models.split(","))
        for name, path in files.items():
            for precision in args.precisions.split(","):
                r = row(str(path), precision, args.runs)
                ratios.setdefault(precision, []).append(float(r.split(" | ")[3]))
                print(f"| {name} | {precision} | {r} |", flush=True)
    for precision, rs in ratios.items():
        print(f"\ngeomean direct / python, {precision}: {float(np.exp(np.mean(np.log(rs)))):.3f}")


if __name__ == "__main__":
    main()
