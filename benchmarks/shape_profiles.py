"""Where fusegraph's time goes at a shape it has not run before, and in a decode step (issue 36).

Two profiles, on the exports of ``variable_length.py`` and ``decode.py`` (made in ``--cache``
if missing), 2 threads:

- ``new-shape``: the BERT encoder (``--layers``, default 2) compiled with the default config
  and run once at length 100 (the process's first request); then cProfile over the first runs
  at ``--lengths`` never-seen lengths (the default path: each one a new shape). Prints the top
  ``--top`` functions by cumulative time and by own time, and the wall time of each run.
- ``decode-step``: the GPT-2 step (``--decoder-layers``, default 4, full vocabulary) compiled
  with ``shape_cache=0`` (the shape-generic kernels that serve every past length), at one
  token with a past of ``--past`` positions: ``fusegraph.tools.profile`` (each kernel timed
  in the generated run, the hooked run beside the plain one) and cProfile over ``--steps``
  plain runs at growing past lengths (what the Python around the kernels costs).

Nothing here is a pass/fail check; it is what the rebuild of issue 36 goes after. Take the
shared lock::

    flock /tmp/fusegraph-bench.lock python benchmarks/shape_profiles.py [new-shape] [decode-step]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from decode import cache_names, export_decoder
from engine_process import load_average, machine_line
from variable_length import export_encoder, request_feeds


def _stats(profiler: cProfile.Profile, sort: str, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(sort).print_stats(top)
    root = str(Path(__file__).resolve().parent.parent)
    return "\n".join(line.replace(root + "/", "") for line in out.getvalue().splitlines()
                     if line.strip() and not line.startswith(("   Ordered by", "   List reduced")))


def new_shape(args) -> None:
    import fusegraph as fg
    path = export_encoder(Path(args.cache), args.layers)
    model = fg.compile(str(path), config=fg.Config(threads=2))
    model.run(request_feeds(0, 0, 100, 30522))
    rng = np.random.default_rng(7)
    lengths = [int(n) for n in rng.choice(np.setdiff1d(np.arange(4, 385), [100]), args.lengths, replace=False)]
    feeds = [request_feeds(0, i + 1, n, 30522) for i, n in enumerate(lengths)]
    profiler = cProfile.Profile()
    walls = []
    for f in feeds:
        t = time.perf_counter()
        profiler.enable()
        model.run(f)
        profiler.disable()
        walls.append((time.perf_counter() - t) * 1e3)
    warm = []
    for f in feeds:
        t = time.perf_counter()
        model.run(f)
        warm.append((time.perf_counter() - t) * 1e3)
    print(f"## new-shape: {path.name}, default config, first runs at lengths {lengths} (under cProfile)")
    print("first run ms (profiled): " + ", ".join(f"{w:.0f}" for w in walls)
          + "; a second run at each, unprofiled: " + ", ".join(f"{w:.1f}" for w in warm))
    print(f"\n### top {args.top} by cumulative time\n```\n{_stats(profiler, 'cumulative', args.top)}\n```")
    print(f"\n### top {args.top} by own time\n```\n{_stats(profiler, 'tottime', args.top)}\n```")


def decode_step(args) -> None:
    import fusegraph as fg
    from fusegraph.tools.profile import profile
    path = export_decoder(Path(args.cache), args.decoder_layers)
    model = fg.compile(str(path), config=fg.Config(threads=2, shape_cache=0))
    past_names, _ = cache_names(args.decoder_layers)
    rng = np.random.default_rng(0)

    def feeds(past: int) -> dict:
        out = {"input_ids": rng.integers(0, 50257, (1, 1)).astype(np.int64),
               "attention_mask": np.ones((1, past + 1), np.int64)}
        out.update({n: rng.standard_normal((1, 12, past, 64)).astype(np.float32) for n in past_names})
        return out

    prof = profile(model, feeds(args.past), runs=args.runs)
    print(f"## decode-step: {path.name}, shape_cache=0, one token after a past of {args.past}")
    print(f"```\n{prof.to_text(top=args.top)}\n```")
    steps = [feeds(args.past + i) for i in range(args.steps)]
    model.run(steps[0])
    profiler = cProfile.Profile()
    t = time.perf_counter()
    profiler.enable()
    for f in steps:
        model.run(f)
    profiler.disable()
    wall = (time.perf_counter() - t) * 1e3 / len(steps)
    print(f"\n### cProfile of {args.steps} plain steps (past {args.past}..{args.past + args.steps - 1}): "
          f"{wall:.1f} ms per step under the profiler; top {args.top} by own time\n"
          f"```\n{_stats(profiler, 'tottime', args.top)}\n```")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("which", nargs="*", help="new-shape, decode-step (default: both)")
    ap.add_argument("--layers", type=int, default=2, help="encoder layers (new-shape)")
    ap.add_argument("--lengths", type=int, default=5, help="never-seen lengths profiled (new-shape)")
    ap.add_argument("--decoder-layers", type=int, default=4)
    ap.add_argument("--past", type=int, default=96, help="past length of the profiled decode step")
    ap.add_argument("--runs", type=int, default=20, help="runs of the per-kernel profile")
    ap.add_argument("--steps", type=int, default=20, help="plain decode steps under cProfile")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cache", default="/work/cache/shapes")
    args = ap.parse_args(argv)
    which = args.which or ["new-shape", "decode-step"]
    if set(which) - {"new-shape", "decode-step"}:
        ap.error(f"unknown profile(s) {sorted(set(which) - {'new-shape', 'decode-step'})}; choose new-shape, decode-step")
    import torch
    torch.set_num_threads(2)
    print(f"{machine_line()}\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load_average()}\n")
    for name in dict.fromkeys(which):
        (new_shape if name == "new-shape" else decode_step)(args)
        print()
    print(f"load average at end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
