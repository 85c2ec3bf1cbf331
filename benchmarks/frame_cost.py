"""What a run at a new input shape costs a model with symbolic input dims before its kernels
run (issue 36): the frame (the shape program's shapes and computed values, the memory plan it
fits, the arena views) and the plans, per source tree, in fresh processes taking turns.

    python benchmarks/frame_cost.py --srcs /tmp/before/src,src [--rounds 3] [--cache DIR]

Two workloads, each on its own model: ``decode``, the GPT-2-small-shaped decoder of
``decode.py`` (4 layers), a prompt of 32 then ``--tokens`` one-token steps with a growing past
(zero feeds: the frames do not read data), whose frames are made ahead; ``lengths``, the
BERT-base-shaped encoder of ``variable_length.py`` (4 layers), ``--requests`` requests of
random lengths 4..384, a frame per new length. Per tree and workload: the frames made,
microseconds per frame with the plans' seconds taken out (``CompiledModel.frame_stats``), the
plans and milliseconds per plan, the whole loop's seconds, the compile's seconds and RssAnon
after the loop (MiB). A tree is chosen by ``PYTHONPATH`` (compile its modules first, ``python
-m compileall -q``); each round runs every tree in a new process, in turn (each first in every
other round, the model file read just before each); the table gives the median over rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import json, sys, time
import numpy as np
workload, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
import fusegraph as fg
t0 = time.perf_counter()
model = fg.compile(path, fg.Config(threads=2))
build = time.perf_counter() - t0
names = [v.name for v in model.graph.inputs]
if workload == "decode":
    sys.path.insert(0, sys.argv[4])
    from engine_process import zero_step_feeds
    steps = [zero_step_feeds(names, 0, 32)] + [zero_step_feeds(names, 32 + i, 1) for i in range(count)]
else:
    rng = np.random.default_rng(0)
    steps = [{n: np.ones((1, int(n_)), np.int64) for n in names} for n_ in rng.integers(4, 385, count)]
t0 = time.perf_counter()
for f in steps:
    model.run(f)
loop = time.perf_counter() - t0
stats = model.frame_stats() if hasattr(model, "frame_stats") else model._executor._runner.frames.stats  # older trees
anon = 0.0
with open("/proc/self/status") as fh:
    for line in fh:
        if line.startswith("RssAnon:"):
            anon = int(line.split()[1]) / 1024
made = stats["frames"] + stats["frames_ahead"]
print(json.dumps({"frames": made, "us_per_frame": (stats["frame_seconds"] - stats["plan_seconds"]) / made * 1e6,
                  "plans": stats["plans"], "ms_per_plan": stats["plan_seconds"] / max(stats["plans"], 1) * 1e3,
                  "loop_s": loop, "build_s": build, "rss_anon_mib": anon}))
'''

FIELDS = ("frames", "us_per_frame", "plans", "ms_per_plan", "loop_s", "build_s", "rss_anon_mib")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--srcs", required=True, help="comma-separated source trees (each holds fusegraph/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256, help="decode: one-token steps after the prompt")
    ap.add_argument("--requests", type=int, default=200, help="lengths: requests")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "fusegraph-bench"),
                    help="folder the exports are kept in")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from decode import export_decoder
    from variable_length import export_encoder
    models = {"decode": (str(export_decoder(Path(args.cache), 4)), args.tokens),
              "lengths": (str(export_encoder(Path(args.cache), 4)), args.requests)}
    srcs = args.srcs.split(",")
    got: dict[tuple, list[dict]] = {}
    for r in range(args.rounds):
        for workload, (path, count) in models.items():
            for src in srcs if r % 2 == 0 else srcs[::-1]:      # each tree first in every other round
                Path(path).read_bytes()                              # the file in the page cache for each
                env = dict(os.environ, PYTHONPATH=src)
                out = subprocess.run([sys.executable, "-c", CHILD, workload, path, str(count), str(HERE)], env=env,
                                     capture_output=True, text=True, check=False)
                row = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
                if row is None:
                    print(f"{workload} {src}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                    continue
                got.setdefault((workload, src), []).append(row)
                print(f"round {r + 1}: {workload} {src} {row}", file=sys.stderr)
    print("| workload | tree | " + " | ".join(FIELDS) + " |")
    print("|---|---|" + "---:|" * len(FIELDS))
    for (workload, src), rows in got.items():
        cells = [f"{statistics.median(r[k] for r in rows):.3g}" for k in FIELDS]
        print(f"| {workload} | {src} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
