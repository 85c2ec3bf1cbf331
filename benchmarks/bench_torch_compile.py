"""``torch.compile(backend="fusegraph")`` beside ``torch.compile`` (Inductor, ``freezing=True``) and
eager, one process, 2 threads, the engines' timed blocks alternating (``fusegraph.tools.bench.alternate``).

Models: the transformer configs of ``tests/model_builders.py`` (BERT, GPT-2, ViT, T5 encoder,
random weights) at ``--hidden`` / ``--seq``, and the plain-torch ResNet-50-style and
MobileNetV2-style CNNs at ``--image``. Per model and engine: the first call's time (the compile,
which torch.compile does lazily, plus one run), the median and p90 latency of the alternating
runs, and the growth of private resident memory (RssAnon) across that engine's first calls
(weights it copied or folded, its arenas and caches; eager's is the baseline's activations).

    flock /tmp/fg-cpu.lock python benchmarks/bench_torch_compile.py [--models bert,resnet50] [--runs 30]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import model_builders as mb  # noqa: E402

from fusegraph.tools.bench import alternate  # noqa: E402


def rss_anon_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build(name: str, args):
    if name == "resnet50":
        return mb.resnet50_style(width=args.width), (torch.randn(1, 3, args.image, args.image),)
    if name == "mobilenetv2":
        return mb.mobilenetv2_style(width=1.0), (torch.randn(1, 3, args.image, args.image),)
    module, example, _ = mb.small_transformer(name, hidden=args.hidden, heads=max(1, args.hidden // 64))
    if name == "vit":
        return module, example
    ids = torch.randint(0, mb.VOCAB, (1, args.seq))
    return module, (ids, torch.ones(1, args.seq, dtype=torch.int64))


def engines(module, example):
    torch._dynamo.reset()
    return {
        "eager": module,
        "fusegraph": torch.compile(module, backend="fusegraph", options={"threads": 2}),
        "inductor": torch.compile(module, options={"freezing": True}),
    }


def run_model(name: str, args) -> dict:
    module, example = build(name, args)
    out = {"model": name, "engines": {}}
    runners = {}
    with torch.inference_mode():
        ref = module(*example)
        for engine, fn in engines(module, example).items():
            before = rss_anon_mib()
            t0 = time.perf_counter()
            got = fn(*example)
            first = time.perf_counter() - t0
            for _ in range(3):
                fn(*example)
            err = float((got - ref).abs().max() / ref.abs().max())
            out["engines"][engine] = {"first_call_s": first, "rss_anon_mib": rss_anon_mib() - before,
                                      "max_rel_err": err}
            runners[engine] = (lambda f=fn: f(*example))
        samples = alternate(runners, runs=args.runs)
    for engine, s in samples.items():
        s = sorted(s)
        out["engines"][engine]["median_ms"] = statistics.median(s)
        out["engines"][engine]["p90_ms"] = s[int(0.9 * (len(s) - 1))]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert,gpt2,vit,t5,resnet50,mobilenetv2")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--image", type=int, default=128)
    p.add_argument("--width", type=int, default=32, help="ResNet-50-style stem width (64 is ResNet-50's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(2)
    if not args.json:
        print(f"{'model':12} {'engine':10} {'median ms':>10} {'p90 ms':>8} {'first call s':>13} "
              f"{'RssAnon MiB':>12} {'max rel err':>12}", flush=True)
    results = []
    for name in args.models.split(","):
        r = run_model(name, args)
        results.append(r)
        if not args.json:
            for engine, e in r["engines"].items():
                print(f"{r['model']:12} {engine:10} {e['median_ms']:10.2f} {e['p90_ms']:8.2f} "
                      f"{e['first_call_s']:13.2f} {e['rss_anon_mib']:12.1f} {e['max_rel_err']:12.2e}", flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
