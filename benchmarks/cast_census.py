"""The Casts a reduced-precision compile leaves between kernels, per model, by what they join:
each Cast counted by its producer's op type, its readers' op types, the type it casts to and
whether it moves more than 4096 elements. Each is a kernel call and a pass over its data that
the precision policy's boundaries cost (``passes/precision.py``), so a boundary worth moving
shows up here first.

    python benchmarks/cast_census.py [--cache DIR] [--models resnet18,...] [--precision bf16] [--top 8]

Models are the zoo's exports (``benchmarks/zoo_table.py``'s cache); nothing runs, it compiles.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os

import fusegraph as fg


def census(path: str, precision: str) -> collections.Counter:
    model = fg.compile(path, fg.Config(threads=2, precision=precision))
    graph = model.graph
    counts: collections.Counter = collections.Counter()
    for node in graph.nodes:
        if node.op_type != "Cast":
            continue
        producer = node.inputs[0].producer
        readers = sorted({user.op_type for user, _ in node.outputs[0].uses})
        elements = 1
        for d in node.outputs[0].shape or ():
            elements *= d if isinstance(d, int) else 1
        counts[(producer.op_type if producer is not None else "input", "+".join(readers) or "output",
                node.outputs[0].dtype.name, "large" if elements > 4096 else "small")] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=os.environ.get("FUSEGRAPH_ZOO_CACHE", os.path.expanduser("~/.cache/fusegraph/zoo")))
    ap.add_argument("--models", default="", help="comma-separated zoo entries (default: every cached export)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(args.cache, "*.onnx")))
    wanted = {m for m in args.models.split(",") if m}
    print(f"| model | casts ({args.precision}) | largest groups: producer -> readers (to type, size) x count |")
    print("|---|---:|---|")
    for path in paths:
        name = os.path.basename(path).split("-")[0]
        if wanted and name not in wanted:
            continue
        counts = census(path, args.precision)
        groups = ", ".join(f"{p} -> {r} ({t}, {s}) x{n}" for (p, r, t, s), n in counts.most_common(args.top))
        print(f"| {name} | {sum(counts.values())} | {groups} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
