"""In-process A/Bs of two choices behind issue 16's numbers, on the random-weight light models
(``zoo.randomize_weights`` seed 0, logits exposed, ``zoo.random_feeds``), 2 threads, batch 1,
every variant in one process, alternating runs, medians.

    python benchmarks/precision_ab.py guards [--precision bf16] [--models densenet121,resnet50] [--runs 30]
    python benchmarks/precision_ab.py auto-rank [--models inception_v1,squeezenet] [--runs 25]

``guards``: the NaN-exact relu (oneDNN's ``elu`` with alpha 0, an ``exp`` per element) against
the fast one, three ways: *inputs only* (the guard before measured inputs: a node runs its fast
relu only where the graph inputs' magnitude bounds it; elementwise chains always exact),
*measured* (the current code: ``runtime/guard_plan.py`` has the values a deep node depends on
measured where they are made), and ``fast_math`` (every fast kernel, NaN-inexact). The outputs of the first two
are compared bit for bit on the feeds.

``auto-rank``: ``precision="auto"`` ranking the ops it moves back to fp32 by error alone (as
before) against squared error per estimated microsecond (``precision_auto.rank``), beside
fp32: what each kept in fp32, the share of the estimated product time left in bf16, the error.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import fusegraph as fg
from fusegraph import precision_auto, zoo
from fusegraph.runtime import guard_plan
from fusegraph.runtime.backends.cpu import backend

THREADS = 2


def _model(name: str, tmp: Path) -> tuple[str, dict]:
    proto = zoo.expose_logits(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0))
    path = tmp / f"{name}.onnx"
    onnx.save(proto, str(path))
    return str(path), zoo.random_feeds(proto)


def _medians(models: dict, feeds: dict, runs: int) -> dict[str, float]:
    times = {k: [] for k in models}
    for m in models.values():
        m.run(feeds)
    for _ in range(runs):
        for k, m in models.items():
            t0 = time.perf_counter()
            m.run(feeds)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def guards(path: str, feeds: dict, precision: str, runs: int) -> str:
    cfg = fg.Config(threads=THREADS, precision=precision)
    keep_below, keep_chain = backend.MEASURE_BELOW, guard_plan._relu_chain
    backend.MEASURE_BELOW, guard_plan._relu_chain = None, (lambda node: False)
    try:
        before = fg.compile(path, cfg)
    finally:
        backend.MEASURE_BELOW, guard_plan._relu_chain = keep_below, keep_chain
    models = {"inputs only": before, "measured": fg.compile(path, cfg),
              "fast_math": fg.compile(path, cfg.replace(fast_math=True))}
    a, b = models["inputs only"].run(feeds), models["measured"].run(feeds)
    same = all(np.array_equal(a[k], b[k]) for k in a)
    med = _medians(models, feeds, runs)
    base = med["inputs only"]
    return (f"{base:.2f} | {med['measured']:.2f} ({med['measured'] / base:.3f}) | "
            f"{med['fast_math']:.2f} ({med['fast_math'] / base:.3f}) | {'yes' if same else 'NO'}")


def auto_rank(path: str, feeds: dict, runs: int) -> str:
    cfg = fg.Config(threads=THREADS, precision="auto")
    new_rank = precision_auto.rank
    precision_auto.rank = lambda sensitivity, time_us: sorted(sensitivity, key=lambda n: -sensitivity[n])
    try:
        old = fg.compile(path, cfg)
    finally:
        precision_auto.rank = new_rank
    new = fg.compile(path, cfg)
    med = _medians({"fp32": fg.compile(path, fg.Config(threads=THREADS)), "old": old, "new": new}, feeds, runs)
    ao, an = old.report.precision["auto"], new.report.precision["auto"]
    return (f"{med['fp32']:.2f} | {med['old'] / med['fp32']:.2f} / {med['new'] / med['fp32']:.2f} | "
            f"{len(ao['kept_fp32'])} / {len(an['kept_fp32'])} | "
            f"{ao['bf16_time_share']:.2f} / {an['bf16_time_share']:.2f} | {ao['error']:.1e} / {an['error']:.1e}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("guards", "auto-rank"))
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    if args.what == "guards":
        print(f"| model ({args.precision}) | inputs only ms | measured ms (x) | fast_math ms (x) | bit for bit |")
        print("|---|---:|---:|---:|---|")
    else:
        print("| model | fp32 ms | auto / fp32, by error / per us | kept fp32 | bf16 time share | error |")
        print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path, feeds = _model(name, Path(tmp))
            row = guards(path, feeds, args.precision, args.runs) if args.what == "guards" \
                else auto_rank(path, feeds, args.runs)
            print(f"| {name} | {row} |", flush=True)


if __name__ == "__main__":
    main()
