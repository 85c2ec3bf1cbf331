"""A product whose rows are known only at run time, three ways (issue 36): what one float32
product costs per call once its kernel exists, and what a never-seen row count costs first.

- ``brgemm packed``: oneDNN's brgemm matmul for that row count over the weight packed in its
  blocked layout (the bf16 path of ``dnnl/linear_runtime.py``; the float32 one before);
- ``brgemm plain``: the same matmul reading the plain ``K x N`` weight;
- ``sgemm``: ``dnnl_sgemm`` over the plain weight, its bias written first (the float32 path).

Per shape and row count: the median of ``--runs`` calls with warm caches, and, for the brgemm
forms, what making the primitive for a new row count took (its JIT code). The products of a
BERT-base layer by default. 2 threads; take the shared lock::

    flock /tmp/fusegraph-bench.lock python benchmarks/runtime_rows.py [--rows 50,120,200,300,383]
"""
from __future__ import annotations

import argparse
import time

import torch

from fusegraph.tools.timing import measure


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="768x2304,768x768,768x3072,3072x768", help="K x N of each weight")
    ap.add_argument("--rows", default="50,120,200,300,383")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from fusegraph.runtime.backends.cpu.dnnl import capi
    from fusegraph.runtime.backends.cpu.dnnl.linear_runtime import REFERENCE_ROWS, RuntimeLinear, warm_sgemm
    from fusegraph.runtime.backends.cpu.dnnl.memory import DTYPES, MemDesc
    from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources, reorder
    lib = capi.load()
    warm_sgemm()
    print(f"{args.threads} threads; ms per call (median of {args.runs}); 'new' = making the primitive "
          f"for that row count\n")
    print("| K x N | rows | brgemm packed | (new) | brgemm plain | (new) | sgemm | sgemm / brgemm packed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    totals = {"packed": 0.0, "plain": 0.0, "sgemm": 0.0}
    for shape in args.shapes.split(","):
        k, n = (int(d) for d in shape.split("x"))
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(k, n, generator=gen) * (2 / k) ** 0.5
        b = torch.randn(n, generator=gen)
        packed = RuntimeLinear(k, n, torch.float32, b, [], Resources(), True)
        prim = packed.make(REFERENCE_ROWS, MemDesc.tagged([k, n], DTYPES[torch.float32], capi.TAG_ANY))
        w_md = prim.md(capi.Q_WEIGHTS_MD)
        blocked = torch.empty(w_md.size, dtype=torch.uint8)
        reorder(MemDesc.of((k, n), torch.float32), w.data_ptr(), w_md, blocked.data_ptr())
        packed.set_weight(blocked, w_md, None)
        plain = RuntimeLinear(k, n, torch.float32, b, [], Resources(), True)
        plain.set_weight(w, MemDesc.of((k, n), torch.float32, (n, 1)), None)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, generator=gen)
            y = torch.empty(m, n)
            want = torch.addmm(b.double(), x.double(), w.double()).float()
            made = {}
            for name, kernel in (("packed", packed), ("plain", plain)):
                t = time.perf_counter()
                kernel._for_rows(m)
                made[name] = (time.perf_counter() - t) * 1e3

            def sgemm():
                y.copy_(b.expand(m, n))
                lib.sgemm(b"N", b"N", m, n, k, 1.0, x.data_ptr(), k, w.data_ptr(), n, 1.0, y.data_ptr(), n)
            got = {}
            for name, fn in (("packed", lambda: packed(x, out=y)), ("plain", lambda: plain(x, out=y)),
                             ("sgemm", sgemm)):
                got[name] = measure(fn, runs=args.runs, warmup=3).median_ms
                torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-3)
                totals[name] += got[name]
            print(f"| {k} x {n} | {m} | {got['packed']:.3f} | ({made['packed']:.2f}) | {got['plain']:.3f} | "
                  f"({made['plain']:.2f}) | {got['sgemm']:.3f} | {got['sgemm'] / got['packed']:.2f} |")
    print(f"\nsum over the table: brgemm packed {totals['packed']:.2f} ms, brgemm plain {totals['plain']:.2f}, "
          f"sgemm {totals['sgemm']:.2f} ({totals['sgemm'] / totals['packed']:.3f} x packed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
