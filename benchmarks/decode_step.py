"""Where a kept-cache decoding step goes, against the floor its weights' bytes set (issue 36).

The model is ``decode.py``'s GPT-2-small-shaped export (``--layers`` 4, the full vocabulary),
compiled with ``Config(threads=2)`` and run as ``model.kv_cache`` does in ``decode.py``'s
``fusegraph-kv`` engine: a prompt of ``--prompt`` tokens, then ``--steps`` one-token steps.
Three measurements, printed as tables:

1. **Kernels inside the step**: every kernel of the session's generated run function is
   wrapped by a timer (the frame builder too), and the steps' time is split by op type (the
   products by node); a second loop without the wrappers gives the step's own time, so the
   wrappers' cost shows as the difference.
2. **The products' floor**: the same products' weights (their shapes, random values) streamed
   by ``dnnl_sgemm`` at one row, in the step's order, with nothing between them; and one product
   of all their bytes at once. The first is what the products cost with no other work; the
   second what the memory system gives a single long stream: the step cannot go below it in
   float32 on this machine, whatever runs the rest.
3. **Small work after a product** (``--after``): a few small torch calls and a byte copy timed
   right after a one-row product of a layer's weight, and again with nothing before them:
   what a product's streaming through the caches costs the calls after it.

2 threads, batch 1; take the shared lock::

    flock /tmp/fusegraph-bench.lock python benchmarks/decode_step.py [--steps 128] [--after]
"""
from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def wrapped_step_times(model, prompt: int, steps: int) -> tuple[dict, dict, list[float], list[float]]:
    """({kernel group: ns per step}, {group: calls per step}, wrapped step ms, plain step ms)."""
    capacity = prompt + 2 * steps + 2
    mask = np.ones((1, capacity), np.int64)

    def loop(session, start: int, n: int) -> list[float]:
        total, ids, times = start, np.array([[5]], np.int64), []
        for _ in range(n):
            total += 1
            t = time.perf_counter()
            out = session.run({"input_ids": ids, "attention_mask": mask[:, :total]})
            ids = np.array([[int(out["logits"][0, -1].argmax())]], np.int64)
            times.append((time.perf_counter() - t) * 1e3)
        return times

    session = model.kv_cache(capacity)
    session.run({"input_ids": np.ones((1, prompt), np.int64), "attention_mask": mask[:, :prompt]})
    plain = loop(session, prompt, steps)
    code = session.runner.code
    labels = {}
    for line in code.source.splitlines():
        found = re.search(r"\b(k\d+)\(.*#\s*'(\w+)' '([^']+)'", line)
        if found:
            op, name = found.group(2), found.group(3)
            labels[found.group(1)] = f"{op} {name}" if op in ("LinearAct", "Linear", "MatMul", "Gemm") else op
    spent: dict[str, int] = collections.defaultdict(int)
    calls: collections.Counter = collections.Counter()

    def timed(label, kernel):
        def call(*args, **kw):
            t = time.perf_counter_ns()
            result = kernel(*args, **kw)
            spent[label] += time.perf_counter_ns() - t
            calls[label] += 1
            return result
        return call

    for name, label in labels.items():
        code.env[name] = timed(label, code.env[name])
    code.env["_FRAME"] = timed("frame (made on a miss, and ahead)", code.env["_FRAME"])
    wrapped = loop(session, prompt + steps, steps)
    return ({k: v / steps for k, v in spent.items()}, {k: v / steps for k, v in calls.items()}, wrapped, plain)


def product_shapes(model) -> list[tuple[int, int]]:
    """(K, N) of every constant-weight product of the compiled graph, in run order."""
    shapes = []
    for node in model._executor.graph.nodes:
        if node.op_type in ("LinearAct", "Linear") and len(node.inputs) > 1 and node.inputs[1].const is not None:
            w = node.inputs[1].const
            trans = int(node.attrs.get("trans_b", 0))
            shapes.append((int(w.shape[1]), int(w.shape[0])) if trans else (int(w.shape[0]), int(w.shape[1])))
    return shapes


def products_floor(shapes: list[tuple[int, int]], rounds: int) -> dict[str, float]:
    """ms of the products at one row with nothing between them, and of one product of all their bytes."""
    import torch
    from fusegraph.runtime.backends.cpu.dnnl import capi
    lib = capi.load()
    weights = [torch.randn(k, n) * 0.02 for k, n in shapes]
    rows = {k: torch.randn(1, k) for k in {k for k, _ in shapes}}
    outs = [torch.empty(1, n) for _, n in shapes]
    total_columns = sum(k * n for k, n in shapes) // 768
    one = torch.randn(768, total_columns) * 0.02
    one_out, one_row = torch.empty(1, total_columns), torch.randn(1, 768)

    def each():
        for w, o, (k, n) in zip(weights, outs, shapes):
            lib.sgemm(b"N", b"N", 1, n, k, 1.0, rows[k].data_ptr(), k, w.data_ptr(), n, 0.0, o.data_ptr(), n)

    def single():
        lib.sgemm(b"N", b"N", 1, total_columns, 768, 1.0, one_row.data_ptr(), 768, one.data_ptr(), total_columns,
                  0.0, one_out.data_ptr(), total_columns)
    got: dict[str, list[float]] = {"each": [], "single": []}
    for _ in range(rounds):
        for name, fn in (("each", each), ("single", single)):
            t = time.perf_counter()
            fn()
            got[name].append((time.perf_counter() - t) * 1e3)
    nbytes = sum(k * n for k, n in shapes) * 4
    return {"MB": nbytes / 1e6, "each_ms": statistics.median(got["each"]), "single_ms": statistics.median(got["single"])}


def after_a_product(rounds: int = 100) -> list[tuple[str, float, float]]:
    """[(call, us right after a one-row product of a 768 x 2304 weight, us with nothing before)]."""
    import ctypes

    import torch
    import torch.nn.functional as F
    from fusegraph.runtime.backends.cpu.dnnl import capi
    lib = capi.load()
    w, x, y = torch.randn(2304, 768), torch.randn(1, 768), torch.empty(1, 2304)
    a, b, s = torch.randn(1, 1, 768), torch.randn(1, 1, 768), torch.empty(1, 1, 768)
    wide = torch.randn(1, 3072)
    q, k, v = torch.randn(1, 12, 1, 64), torch.randn(1, 12, 100, 64), torch.randn(1, 12, 100, 64)
    calls = {
        "torch.add of two 768-wide rows (out=)": lambda: torch.add(a, b, out=s),
        "ctypes.memmove of 3 KB": lambda: ctypes.memmove(s.data_ptr(), a.data_ptr(), 3072),
        "GELU of a 3072-wide row (ATen)": lambda: F.gelu(wide),
        "scaled_dot_product_attention, one row, 12 heads, 100 keys": lambda: F.scaled_dot_product_attention(q, k, v),
        "float(t.sum()) of 2 floats": lambda: float(a[0, 0, :2].sum()),
    }

    def product():
        lib.sgemm(b"N", b"T", 1, 2304, 768, 1.0, x.data_ptr(), 768, w.data_ptr(), 768, 0.0, y.data_ptr(), 2304)
    rows = []
    for name, fn in calls.items():
        cold, hot = [], []
        for _ in range(rounds):
            product()
            t = time.perf_counter_ns()
            fn()
            cold.append(time.perf_counter_ns() - t)
        for _ in range(rounds):
            t = time.perf_counter_ns()
            fn()
            hot.append(time.perf_counter_ns() - t)
        rows.append((name, statistics.median(cold) / 1e3, statistics.median(hot) / 1e3))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/work/cache/shapes", help="folder the exports are kept in")
    ap.add_argument("--after", action="store_true", help="also time small calls right after a product")
    args = ap.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    import fusegraph as fg
    from decode import export_decoder
    from engine_process import load_average, machine_line

    path = export_decoder(Path(args.cache), args.layers)
    print(machine_line())
    print(f"load average {load_average()}; {args.threads} threads; {path.name}: prompt {args.prompt}, "
          f"then {args.steps} steps twice (plain, then with every kernel timed)\n")
    model = fg.compile(str(path), config=fg.Config(threads=args.threads))
    spent, calls, wrapped, plain = wrapped_step_times(model, args.prompt, args.steps)
    kernels_ms = sum(spent.values()) / 1e6
    print(f"step: {statistics.median(plain):.2f} ms median, {statistics.mean(plain):.2f} mean "
          f"(with the timers: {statistics.median(wrapped):.2f} / {statistics.mean(wrapped):.2f}); "
          f"kernels {kernels_ms:.2f} ms a step, the rest (feeds, outputs, generated code, argmax) "
          f"{statistics.mean(wrapped) - kernels_ms:.2f}\n")
    print("| kernels | us / step | calls / step |\n|---|---:|---:|")
    products = {k: v for k, v in spent.items() if k.split()[0] in ("LinearAct", "Linear", "MatMul", "Gemm")}
    print(f"| the {len(products)} products | {sum(products.values()) / 1e3:.0f} | "
          f"{sum(calls[k] for k in products):.0f} |")
    for name, ns in sorted(products.items(), key=lambda kv: -kv[1])[:3]:
        print(f"| &nbsp; of which {name} | {ns / 1e3:.0f} | {calls[name]:.0f} |")
    for name, ns in sorted(((k, v) for k, v in spent.items() if k not in products), key=lambda kv: -kv[1]):
        print(f"| {name} | {ns / 1e3:.0f} | {calls[name]:.1f} |")
    floor = products_floor(product_shapes(model), rounds=30)
    print(f"\nthe products' {floor['MB']:.0f} MB of weights at one row, nothing between them: "
          f"{floor['each_ms']:.2f} ms ({floor['MB'] / floor['each_ms']:.1f} GB/s); one product of all those "
          f"bytes: {floor['single_ms']:.2f} ms ({floor['MB'] / floor['single_ms']:.1f} GB/s)")
    if args.after:
        print("\n| call | us right after a one-row product | us with nothing before |\n|---|---:|---:|")
        for name, cold, hot in after_a_product():
            print(f"| {name} | {cold:.1f} | {hot:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
