"""What each op type costs inside a whole run: the run timed with that type's kernels replaced
by their recorded outputs, against the full run and onnxruntime, in one process.

A debug hook (``profile_nodes.py``) times each kernel but slows the run it measures, and a
kernel timed alone runs with warm caches and a hot thread team; neither shows what a kernel
adds to a real run. Here the generated ``run`` function is called as it is, once with every
kernel recorded, then with the kernels of one op type swapped for functions that return
the recorded outputs (no work, same Python calls). ``full - without T`` is what T costs in
the run, cache misses and thread wake-ups included; ``only T`` runs T alone (every other
kernel replaced). Alternating blocks (``fusegraph.tools.bench.alternate``), medians, 2 threads by
default; random-weight light models and the BERT / GPT-2 exports as in ``bench_latency.py``.

    python benchmarks/marginal_cost.py MODEL [--threads 2] [--runs 300] [--only LinearAct]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

CALL = re.compile(r"^\s+(?:.+ = )?(k\d+)\(.*\)  # (\S+) ")


def _run_calls(source: str) -> list[tuple[str, str]]:
    """(kernel global, op type) of every call in the generated ``run`` (not ``_memo_fill``)."""
    body = source.split("\ndef _memo_fill")[0]
    return [(m.group(1), m.group(2)) for line in body.splitlines() if (m := CALL.match(line))]


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_latency import model_files

    import fusegraph as fg
    from fusegraph.tools.bench import ort_runner, alternate, random_feeds_for
    from fusegraph.runtime.feeds import convert_feeds

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--only", default="", help="op types to also run alone (comma-separated)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = model_files(Path(tmp), [args.model])[args.model]
        model = fg.compile(str(path), fg.Config(threads=args.threads))
        feeds = random_feeds_for(model)
        ort_run = ort_runner(str(path), args.threads, feeds)
    executor = model._executor
    code = executor.code
    env, fn = code.env, code.function
    tensors = convert_feeds(model.name, executor.inputs, feeds)
    calls = _run_calls(code.source)
    kernels = {k: env[k] for k, _ in calls}
    recorded: dict[str, object] = {}

    def recording(k):
        def record(*a, **kw):
            recorded[k] = kernels[k](*a, **kw)
            return recorded[k]
        return record

    env.update({k: recording(k) for k in kernels})
    with torch.inference_mode():
        fn(*tensors)

    def variant(replaced: set[str]):
        table = {k: ((lambda r: lambda *a, **kw: r)(recorded[k]) if op in replaced else kernels[k])
                 for k, op in calls}

        def run():
            env.update(table)
            with torch.inference_mode():
                fn(*tensors)
        return run

    counts = Counter(op for _, op in calls)
    every = set(counts)
    rows = {"full": (set(), len(calls))}      # name -> (op types replaced, kernels still run)
    for op, n in counts.most_common():
        rows[f"without {op}"] = ({op}, len(calls) - n)
    for op in filter(None, args.only.split(",")):
        rows[f"only {op}"] = (every - {op}, counts[op])
    rows["no kernel work"] = (every, 0)
    runners = {name: variant(replaced) for name, (replaced, _) in rows.items()}
    runners["onnxruntime"] = ort_run
    samples = alternate(runners, runs=args.runs, warmup=30, block=10)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.model}, {args.threads} threads, {args.runs} runs per row, median ms\n")
    print("| run | kernels | ms | full - this ms |")
    print("|---|---:|---:|---:|")
    for name, ms in med.items():
        kept = rows[name][1] if name in rows else ""
        print(f"| {name} | {kept} | {ms:.3f} | {med['full'] - ms:+.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
