"""Decoding a large KServe JSON request body (issue 39 #4): ``json.loads`` (what the server
did, on its event loop) against ``fusegraph.serve.json_body.loads`` (what it does now, on a
worker thread), each in a fresh process on the same body: seconds to decode, the longest a
second thread waiting for the interpreter went without running (what ``/v2/health/live`` would
wait), and the peak private memory (RssAnon high-water, sampled every millisecond) the decode
added. The body: one FP32 input of ``--mb`` megabytes of JSON numbers (Python's ``repr`` of
float32 values, as tritonclient writes them). No onnxruntime column: it decodes no JSON.

    python benchmarks/json_decode.py [--mb 57] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_CHILD = r"""
import json, sys, threading, time
parser, path = sys.argv[1:3]
body = open(path, "rb").read()
if parser == "json":
    decode = json.loads
else:
    from fusegraph.serve.json_body import loads as decode
def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:")) * 1024
base, peak, gaps, done = anon(), [0], [], threading.Event()
def tick():
    last = time.perf_counter()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        peak[0] = max(peak[0], anon())
ticker = threading.Thread(target=tick); ticker.start(); time.sleep(0.05)
t0 = time.perf_counter()
out = decode(body)
seconds = time.perf_counter() - t0
done.set(); ticker.join()
print(json.dumps({"s": seconds, "gap": max(gaps), "peak_mib": (peak[0] - base) / 2**20}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=57.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = int(args.mb * 1e6 / 21)          # about 21 characters per float32 written by repr
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, n], "datatype": "FP32", "data": x.tolist()}]}).encode()
    print(f"body: {len(body) / 1e6:.1f} MB, {n} numbers\n")
    print("| parser | decode s | longest wait of another thread s | peak RssAnon added MiB |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "body.json"
        path.write_bytes(body)
        for parser in ("json", "json_body"):
            rows = []
            for _ in range(args.repeats):
                out = subprocess.run([sys.executable, "-c", _CHILD, parser, str(path)], capture_output=True,
                                     text=True, check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            med = {k: statistics.median(r[k] for r in rows) for k in ("s", "gap", "peak_mib")}
            name = "json.loads" if parser == "json" else "json_body.loads"
            print(f"| {name} | {med['s']:.2f} | {med['gap']:.3f} | {med['peak_mib']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
