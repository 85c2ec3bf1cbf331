"""What verifying by default costs a compile: the pass manager checks the graph (``Graph.verify``
with the op registry's inference) as imported and after the pipeline (issue 38, item 4).

Per model (the nine light models with random weights and the BERT export, 2 layers, hidden
768), in one process, alternating: ``fg.compile`` with the default verification and with the
manager's two checks stubbed out (what a compile did before), ``--repeats`` times each; the
median compile time of each, their difference, ``report.timings["verify"]`` (the seconds the
two checks took, measured inside the compile), its share of the compile, and onnxruntime's
session creation (ORT_ENABLE_ALL, 2 threads) as the peer's build time. The compiled graph is
the same either way (verification changes nothing), so latency is not measured here; RssAnon
is the process's private memory after the model's compiles. Also ``--each``: the cost of
``verify_each=True`` (every pass), for comparison.

    flock /tmp/fusegraph-bench.lock python benchmarks/verify_cost.py [--models resnet50,bert] [--repeats 5]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fusegraph as fg  # noqa: E402
from fusegraph.passes.manager import PassManager  # noqa: E402
from fusegraph.testing import zoo  # noqa: E402
from bench_latency import model_files  # noqa: E402


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def compile_s(path: Path, config: fg.Config, verify: bool) -> tuple[float, float]:
    """(wall seconds of fg.compile, report.timings["verify"])."""
    real = PassManager._verify
    if not verify:
        PassManager._verify = lambda self, graph, error: 0.0
    try:
        gc.collect()
        t0 = time.perf_counter()
        model = fg.compile(str(path), config)
        seconds = time.perf_counter() - t0
    finally:
        PassManager._verify = real
    verify_s = model.report.timings.get("verify", 0.0)
    model.close()
    return seconds, verify_s


def ort_session_s(path: Path, threads: int, repeats: int) -> float:
    import onnxruntime as ort
    samples = []
    for _ in range(repeats):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        t0 = time.perf_counter()
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(list(zoo.LIGHT_MODELS) + ["bert"]))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--each", action="store_true", help="also compile with verify_each=True")
    args = ap.parse_args()
    config = fg.Config(threads=args.threads)
    print("| model | nodes | compile s, no verify | compile s, verify (default) | difference s | "
          "verify s (report) | verify share | verify_each s (report) | ORT session s | RssAnon MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in model_files(Path(tmp), args.models.split(",")).items():
            compile_s(path, config, True)     # warm: imports, oneDNN's JIT, the first bind
            off, on, inside = [], [], []
            for _ in range(args.repeats):
                off.append(compile_s(path, config, False)[0])
                seconds, verify_s = compile_s(path, config, True)
                on.append(seconds)
                inside.append(verify_s)
            each = ""
            if args.each:
                each = f"{statistics.median(compile_s(path, config.replace(verify_each=True), True)[1] for _ in range(3)):.4f}"
            nodes = fg.compile(str(path), config)
            n = nodes.report.nodes_imported
            nodes.close()
            m_off, m_on, m_in = statistics.median(off), statistics.median(on), statistics.median(inside)
            print(f"| {name} | {n} | {m_off:.3f} | {m_on:.3f} | {m_on - m_off:+.3f} | {m_in:.4f} | "
                  f"{100 * m_in / m_on:.2f} % | {each or '-'} | {ort_session_s(path, args.threads, 3):.3f} | "
                  f"{rss_anon_mb():.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
