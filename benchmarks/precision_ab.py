"""In-process A/Bs of two choices behind issue 16's numbers, on the random-weight light models
(``zoo.randomize_weights`` seed 0, logits exposed, ``zoo.random_feeds``), 2 threads, batch 1,
every variant in one process, alternating runs, medians.

    python benchmarks/precision_ab.py guards [--precision bf16] [--models densenet121,resnet50] [--runs 30]
    python benchmarks/precision_ab.py auto-rank [--models inception_v1,squeezenet] [--runs 25]
    python benchmarks/precision_ab.py auto-declined [--models squeezenet,resnet50] [--runs 20]
    python benchmarks/precision_ab.py first-fp32 [--models resnet50,vgg19] [--k 0,1,2,4,8,16] [--inputs 4] [--runs 20]
    python benchmarks/precision_ab.py stored-bf16 [--models squeezenet,resnet50] [--runs 20]

``guards``: the NaN-exact relu (oneDNN's ``elu`` with alpha 0, an ``exp`` per element) against
the fast one, three ways: *inputs only* (the guard before measured inputs: a node runs its fast
relu only where the graph inputs' magnitude bounds it; elementwise chains always exact),
*measured* (the current code: ``runtime/backends/cpu/guard_plan.py`` has the values a deep node depends on
measured where they are made), and ``fast_math`` (every fast kernel, NaN-inexact). The outputs of the first two
are compared bit for bit on the feeds.

``auto-rank``: ``precision="auto"`` ranking the ops it moves back to fp32 by error alone (as
before) against squared error per estimated microsecond (``precision_auto.rank``), beside
fp32: what each kept in fp32, the share of the estimated product time left in bf16, the error.

``auto-declined`` (for a CPU without bfloat16 arithmetic): ``precision="auto"`` searching as
before (bf16 where the budget allows) against what it gives now there (the fp32 model,
``precision_auto.bf16_declined``), beside fp32: latency, bf16 nodes, error against fp32.
Both ``auto`` modes search on any CPU (the declining patched off where they search).

``first-fp32``: bf16 with the model's first k products (graph order) kept fp32 by name
(``op_precision``), for each of ``--k``: their share of the estimated product time
(``CostModel.product_us``), latency against fp32, and the median over ``--inputs`` inputs of
the error against fp32 (worst output, and the logits): how much of a deep random net's bf16
error its first layers make, and at what cost.

``stored-bf16`` (for a CPU without bfloat16 arithmetic, where oneDNN has no bf16 kernels):
bf16 as before (the convolutions and products fall to ATen's bf16 kernels) against the float32
primitives over bf16 storage (``dnnl/compute.py``), beside fp32: latency, the relative L2 of
the worst output against fp32, and ``.fgm`` load ms (median of 3) and size.
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
from fusegraph.compiler import precision_auto
from fusegraph.testing import zoo
from fusegraph.ir import DType
from fusegraph.runtime.backends.cpu import guard_plan
from fusegraph.compiler.accuracy import output_errors, worst_rel_l2
from fusegraph.runtime.backends.cpu import backend
from fusegraph.runtime.backends.cpu.dnnl import compute

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


def _searched(path: str, cfg) -> fg.CompiledModel:
    """``precision="auto"`` searching whatever the CPU (``precision_auto.bf16_declined`` says
    None, as on a CPU with bf16 arithmetic)."""
    real = precision_auto.bf16_declined
    precision_auto.bf16_declined = lambda device: None
    try:
        return fg.compile(path, cfg)
    finally:
        precision_auto.bf16_declined = real


def auto_rank(path: str, feeds: dict, runs: int) -> str:
    cfg = fg.Config(threads=THREADS, precision="auto")
    new_rank = precision_auto.rank
    precision_auto.rank = lambda sensitivity, time_us: sorted(sensitivity, key=lambda n: -sensitivity[n])
    try:
        old = _searched(path, cfg)
    finally:
        precision_auto.rank = new_rank
    new = _searched(path, cfg)
    med = _medians({"fp32": fg.compile(path, fg.Config(threads=THREADS)), "old": old, "new": new}, feeds, runs)
    ao, an = old.report.precision["auto"], new.report.precision["auto"]
    return (f"{med['fp32']:.2f} | {med['old'] / med['fp32']:.2f} / {med['new'] / med['fp32']:.2f} | "
            f"{len(ao['kept_fp32'])} / {len(an['kept_fp32'])} | "
            f"{ao['bf16_time_share']:.2f} / {an['bf16_time_share']:.2f} | {ao['error']:.1e} / {an['error']:.1e}")


def auto_declined(path: str, feeds: dict, runs: int) -> str:
    cfg = fg.Config(threads=THREADS, precision="auto")
    models = {"fp32": fg.compile(path, fg.Config(threads=THREADS)), "searched": _searched(path, cfg),
              "now": fg.compile(path, cfg)}
    med = _medians(models, feeds, runs)
    want = models["fp32"].run(feeds)
    err = {k: worst_rel_l2(output_errors(models[k].run(feeds), want)) for k in ("searched", "now")}
    bf16 = {k: models[k].report.precision["by_dtype"].get("bf16", 0) for k in ("searched", "now")}
    f = med["fp32"]
    return (f"{f:.2f} | {med['searched'] / f:.2f} / {med['now'] / f:.2f} | {bf16['searched']} / {bf16['now']} | "
            f"{err['searched']:.1e} / {err['now']:.1e} | {models['now'].report.precision['auto']['declined'] or '-'}")


def first_fp32(path: str, feeds: dict, runs: int, ks: list[int], inputs: int) -> list[str]:
    """One row per k: the model's first k products (graph order) kept fp32 by name."""
    from fusegraph.plan.cost import CostModel
    proto = onnx.load(path)
    heavy = [n.name for n in proto.graph.node if n.op_type in ("Conv", "MatMul", "Gemm")]
    feeds_of = [feeds] + [zoo.random_feeds(proto, seed=i) for i in range(1, inputs)]
    fp32 = fg.compile(path, fg.Config(threads=THREADS))
    wants = [fp32.run(f) for f in feeds_of]
    models = {k: fg.compile(path, fg.Config(threads=THREADS, precision="bf16",
                                            op_precision={h: "fp32" for h in heavy[:k]})) for k in ks}
    med = _medians({"fp32": fp32, **models}, feeds, runs)
    cost = CostModel.for_device("cpu")
    rows = []
    for k, m in models.items():
        products = [n for n in m.graph.nodes if n.op_type in ("FusedConv", "Linear", "LinearAct", "BatchMatMul",
                                                              "MatMul", "Gemm", "Conv")]
        total = sum(cost.product_us(n) for n in products)
        kept = sum(cost.product_us(n) for n in products
                   if all(v.dtype == DType.FLOAT for v in n.inputs[:2] if v is not None))
        errs = [output_errors(m.run(f), w) for f, w in zip(feeds_of, wants)]
        worst = statistics.median(worst_rel_l2(e) for e in errs)
        logits = statistics.median(e["logits"]["rel_l2"] for e in errs) if "logits" in errs[0] else float("nan")
        rows.append(f"{k} | {kept / total:.3f} | {med[k] / med['fp32']:.2f} | {worst:.2e} | {logits:.2e}")
    return rows


def stored_bf16(path: str, feeds: dict, runs: int) -> str:
    cfg = fg.Config(threads=THREADS, precision="bf16")
    real = compute.bfloat16_arithmetic
    compute.bfloat16_arithmetic = lambda: True     # as before: bf16 primitives asked for, ATen's when none
    try:
        aten = fg.compile(path, cfg)
    finally:
        compute.bfloat16_arithmetic = real
    models = {"fp32": fg.compile(path, fg.Config(threads=THREADS)), "aten": aten, "stored": fg.compile(path, cfg)}
    med = _medians(models, feeds, runs)
    want = models["fp32"].run(feeds)
    err = {k: worst_rel_l2(output_errors(m.run(feeds), want)) for k, m in models.items() if k != "fp32"}
    loads = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in ("fp32", "stored"):
            fgm = Path(tmp) / f"{k}.fgm"
            models[k].save(fgm)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fg.load(fgm)
                times.append(time.perf_counter() - t0)
            loads[k] = (statistics.median(times) * 1e3, fgm.stat().st_size / 2**20)
    f = med["fp32"]
    return (f"{f:.2f} | {med['aten']:.2f} ({med['aten'] / f:.2f}) | {med['stored']:.2f} ({med['stored'] / f:.2f}) | "
            f"{err['aten']:.1e} / {err['stored']:.1e} | {loads['fp32'][0]:.0f} / {loads['stored'][0]:.0f} | "
            f"{loads['fp32'][1]:.1f} / {loads['stored'][1]:.1f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("guards", "auto-rank", "auto-declined", "first-fp32", "stored-bf16"))
    ap.add_argument("--k", default="0,1,2,4,8,16", help="first-fp32: how many first products to keep fp32")
    ap.add_argument("--inputs", type=int, default=4, help="first-fp32: inputs the errors are medians over")
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS))
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    if args.what == "guards":
        print(f"| model ({args.precision}) | inputs only ms | measured ms (x) | fast_math ms (x) | bit for bit |")
        print("|---|---:|---:|---:|---|")
    elif args.what == "auto-rank":
        print("| model | fp32 ms | auto / fp32, by error / per us | kept fp32 | bf16 time share | error |")
        print("|---|---:|---:|---:|---:|---:|")
    elif args.what == "first-fp32":
        print(f"| model | k first products fp32 | their share of the estimated product time | bf16 / fp32 ms "
              f"| worst output rel-L2 vs fp32 (median of {args.inputs} inputs) | logits rel-L2 |")
        print("|---|---:|---:|---:|---:|---:|")
    elif args.what == "auto-declined":
        print("| model | fp32 ms | auto / fp32, searched / now | bf16 nodes | error vs fp32 | declined |")
        print("|---|---:|---:|---:|---:|---|")
    else:
        print("| model | fp32 ms | bf16 on ATen ms (x fp32) | bf16 stored, fp32 primitives ms (x) "
              "| rel-L2 ATen / stored | .fgm load ms fp32 / bf16 | .fgm MiB fp32 / bf16 |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path, feeds = _model(name, Path(tmp))
            run = {"guards": lambda: [guards(path, feeds, args.precision, args.runs)],
                   "auto-rank": lambda: [auto_rank(path, feeds, args.runs)],
                   "auto-declined": lambda: [auto_declined(path, feeds, args.runs)],
                   "first-fp32": lambda: first_fp32(path, feeds, args.runs, [int(k) for k in args.k.split(",")],
                                                    args.inputs),
                   "stored-bf16": lambda: [stored_bf16(path, feeds, args.runs)]}[args.what]
            for row in run():
                print(f"| {name} | {row} |", flush=True)


if __name__ == "__main__":
    main()
