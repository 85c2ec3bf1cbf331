"""Elementwise-chain kernels measured against each other (issue 4, transformer fusion):
the chain unfused (one allocation per op, as the graph runs it at O0), fusegraph's
``ElementwiseChain`` kernel (first op into the output buffer, the rest in place on it), and
the same chain compiled by ``torch.compile`` (inductor's generated C++ loop; ``--compiled``,
slow to build: tens of seconds per chain on 2 cores). Chain: the tanh GELU written out
(9 ops), which is what a GELU the ``gelu`` rule declines would leave. Median of --runs.

    python benchmarks/bench_elementwise_chain.py [--threads 1] [--compiled]
"""
from __future__ import annotations

import argparse
import time

import torch

from fusegraph.ir import Graph, DType
from fusegraph.ops import NodeContext, lookup
from fusegraph.tools.timing import measure

STEPS = ["Mul i0 i0", "Mul p i0", "Mul p i1", "Add p i0", "Mul p i2", "Tanh p", "Add p i3", "Mul p i0", "Mul p i4"]
CONSTS = (0.044715, 0.7978845608028654, 1.0, 0.5)


def eager(x):
    return 0.5 * (x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x)))))


def chain_kernel(shape):
    g = Graph("bench", {"": 18, "fusegraph": 1})
    x = g.add_input("x", DType.FLOAT, shape)
    consts = [g.add_constant(f"c{i}", torch.tensor(c)) for i, c in enumerate(CONSTS)]
    node = g.add_node("ElementwiseChain", [x] + consts, attrs={"steps": STEPS}, domain="fusegraph", version=1)
    kernel = lookup("fusegraph", "ElementwiseChain", 1).build(NodeContext(node))
    cs = [c.const for c in consts]
    return lambda t, out: kernel(t, *cs, out=out)


def median_us(fn, runs):
    return measure(fn, runs=runs, warmup=10).median_ms * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--compiled", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("| shape | unfused us | in-place chain us | compiled us |")
    print("|---|---:|---:|---:|")
    for shape in ((1, 1, 3072), (1, 16, 3072), (1, 128, 3072)):
        x, out = torch.randn(shape), torch.empty(shape)
        inplace = chain_kernel(shape)
        torch.testing.assert_close(inplace(x, out), eager(x))
        row = [median_us(lambda: eager(x), args.runs), median_us(lambda: inplace(x, out), args.runs)]
        if args.compiled:
            t0 = time.perf_counter()
            compiled = torch.compile(eager, dynamic=False)
            compiled(x)
            build = time.perf_counter() - t0
            row.append(median_us(lambda: compiled(x), args.runs))
            print(f"| {list(shape)} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} (built in {build:.0f} s) |")
        else:
            print(f"| {list(shape)} | {row[0]:.1f} | {row[1]:.1f} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
