"""A loaded ``.fgm``'s weights in huge pages over time (``artifact/container.py``,
``advise_huge_pages``): the decoder of ``decode.py`` (GPT-2-small-shaped, 4 layers) compiled
and saved once; then one fresh process loads the file twice, once as ``fg.load`` does (its
bytes advised for huge pages once read) and once with the advice left out (the code before),
and runs one-token steps at pasts 32..95 (zero feeds, frames kept) on the two in turn for
``--seconds``; every ``--every`` seconds it prints both medians, their ratio and the
process's huge-page bytes (``AnonHugePages``); the first line gives both loads' seconds and
the process's RssAnon.

    python benchmarks/loaded_pages.py [--seconds 300] [--every 30] [--cache DIR]

The file's bytes are advised once read, and Linux's khugepaged moves them into 2 MiB pages
at its own pace (``/sys/kernel/mm/transparent_hugepage/khugepaged``: pages scanned per pass
and the sleep between passes), so the loaded model's steps approach the compiled model's,
whose packed weights are in huge pages from the start.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import statistics, sys, time
import fusegraph as fg
from fusegraph.artifact import container
path, seconds, every = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
t0 = time.perf_counter()
advised = fg.load(path)
load_advised = time.perf_counter() - t0
advise = container.advise_huge_pages
container.advise_huge_pages = lambda mm: False          # the code before: the bytes left as read
t0 = time.perf_counter()
plain = fg.load(path)
load_plain = time.perf_counter() - t0
container.advise_huge_pages = advise
names = [v.name for v in advised.graph.inputs]
sys.path.insert(0, sys.argv[4])
from engine_process import zero_step_feeds
def feeds(past, seq=1):
    return zero_step_feeds(names, past, seq)
def status(key):
    with open("/proc/self/smaps_rollup" if key == "AnonHugePages" else "/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    return 0
steps = [feeds(p) for p in range(32, 96)]
for model in (advised, plain):
    model.run(feeds(0, 32))
    for f in steps:
        model.run(f)
print(f"load s: advised {load_advised:.2f}, plain {load_plain:.2f}; RssAnon {status('RssAnon')} MiB (both)", flush=True)
print("| s | advised step ms | plain step ms | advised / plain | AnonHugePages MiB |")
print("|---:|---:|---:|---:|---:|")
start = time.perf_counter()
while True:
    a, b = [], []
    for f in steps:
        t = time.perf_counter()
        advised.run(f)
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        plain.run(f)
        b.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    ma, mb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
    print(f"| {elapsed:.0f} | {ma:.2f} | {mb:.2f} | {ma / mb:.3f} | {status('AnonHugePages')} |", flush=True)
    if elapsed >= seconds:
        break
    time.sleep(max(0.0, every - (time.perf_counter() - start - elapsed)))
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--every", type=float, default=30.0)
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "fusegraph-bench"),
                    help="folder the export and its .fgm are kept in")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from decode import export_decoder
    onnx_path = export_decoder(Path(args.cache), 4)
    fgm = onnx_path.with_suffix(".fgm")
    if not fgm.exists():
        import fusegraph as fg
        fg.compile(str(onnx_path), fg.Config(threads=2)).save(fgm)
    subprocess.run([sys.executable, "-c", CHILD, str(fgm), str(args.seconds), str(args.every), str(HERE)],
                   check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
