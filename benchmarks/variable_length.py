"""Variable-length serving on a dynamic-axis BERT-base-shaped encoder (issue 36).

The model: ``transformers`` BertModel (no pooler) at ``--hidden`` 768, ``--heads`` 12,
``--intermediate`` 3072, ``--vocab`` 30522, ``--positions`` 512, random weights (seed 0), for
each ``--layers`` count, exported with ``torch.onnx.export(dynamo=False, opset 17)``: inputs
``input_ids`` and ``attention_mask`` with (batch, seq) axes, output ``last_hidden_state``;
checked against PyTorch through onnxruntime when exported, kept in ``--cache``.

The traffic: ``--requests`` (200) requests of batch 1, lengths drawn uniformly from
``--min-len``..``--max-len`` (4..384, both included) with ``--seed``, one after another, in
one fresh process per engine (``engine_process.py``): ``fusegraph`` (``fg.compile(path,
config=fg.Config(threads=2))``), ``fusegraph-fgm`` (that model saved by the parent, then
``fg.load`` in the child), ``fusegraph-sc8`` (``Config(threads=2, shape_cache=8)``: a compile
per input shape, up to 8 kept, the behaviour before one compile served every shape) and ``onnxruntime`` (ORT_ENABLE_ALL, 2 intra-op threads, sequential).
Per engine: build or load time, the total of the requests' latencies, p50 / p99 per request,
RssAnon after the requests minus after the imports, its largest value sampled between
requests, and VmHWM's growth (the whole RSS's peak, between samples too).

The compile stall: after those requests, at each of ``--stall-lengths`` (30) lengths that no
request had (same range, drawn with ``--seed`` + 1), the first run's time over the median of
``--warm-runs`` (3) runs after it; the table gives the median and the max over the lengths.

Correctness: the outputs of a sample of the requests (the first two, then every 20th) and of
the first run at every sixth stall length, every engine, against onnxruntime ORT_DISABLE_ALL
on the same inputs: the largest |difference| over the largest |value| per output, and
``numpy.allclose`` at rtol 1e-4, atol 1e-5 x max(1, largest |value|) (tests/oracle.py's
measure). Any miss makes the script exit 1 after the tables, naming the engine and length.

``--warm-lengths 8,32,128,384``: after that, each engine runs each of these lengths warm (two
runs, then the median of ``--warm-runs`` more) and a second table gives the warm latency per
length beside onnxruntime's: where the totals average over lengths, this shows which lengths
an engine is slow at (a product of few rows is bound by reading its weights).

``--repeat N`` runs the engines N times, taking turns (forwards, then backwards), and the table
gives each figure's median over the rounds. 2 threads throughout. Take the shared lock::

    flock /tmp/fusegraph-bench.lock python benchmarks/variable_length.py --layers 2,4 [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from engine_process import (
    ATOL,
    RTOL,
    child_spec,
    close_enough,
    load_average,
    machine_line,
    memory_delta,
    memory_status,
    ort_session,
    percentiles,
    reset_peak,
    run_child,
    save_fgm,
    write_result,
)

ENGINES = ("fusegraph", "fusegraph-fgm", "fusegraph-sc8", "onnxruntime")
CHILD_TIMEOUT_S = 3600


# ----- the model and the traffic ----------------------------------------------------------------

def export_encoder(folder: Path, layers: int, hidden: int = 768, heads: int = 12, intermediate: int = 3072,
                   vocab: int = 30522, positions: int = 512) -> Path:
    """The BERT export at these sizes, from ``folder`` if made before; a new export is checked
    against PyTorch through onnxruntime (ORT_DISABLE_ALL) before it is kept."""
    folder = Path(folder)
    path = folder / f"bert_L{layers}_H{hidden}_A{heads}_I{intermediate}_V{vocab}_P{positions}.onnx"
    if path.exists():
        return path
    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, intermediate_size=intermediate,
                                max_position_embeddings=positions), add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    encoder = Encoder().eval()
    ids = torch.randint(0, vocab, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(encoder, (ids, mask), str(tmp), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"},
                                        "last_hidden_state": {0: "batch", 1: "seq"}})
    try:
        for length in (5, min(37, positions)):                  # not the traced length
            feeds = request_feeds(0, length, length, vocab)
            with torch.no_grad():
                want = encoder(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])).numpy()
            got = ort_session(str(tmp), optimized=False).run(None, feeds)[0]
            ok, err = close_enough(got, want)
            if not ok:
                raise RuntimeError(f"{path.name}: the export differs from PyTorch at length {length} "
                                   f"(largest error over largest value {err:.2e})")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def request_lengths(requests: int, lo: int, hi: int, seed: int) -> list[int]:
    return [int(n) for n in np.random.default_rng(seed).integers(lo, hi + 1, requests)]


def stall_lengths(count: int, lo: int, hi: int, seen: set[int], seed: int) -> list[int]:
    """``count`` distinct lengths in lo..hi that no request had (fewer where the range has fewer)."""
    unseen = [n for n in range(lo, hi + 1) if n not in seen]
    rng = np.random.default_rng(seed + 1)
    return [int(n) for n in rng.permutation(unseen)[:count]]


def request_feeds(seed: int, index: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    """Request ``index``'s inputs: random token ids, no padding (a batch of one)."""
    rng = np.random.default_rng((seed, index, length))
    return {"input_ids": rng.integers(0, vocab, (1, length)).astype(np.int64),
            "attention_mask": np.ones((1, length), np.int64)}


# ----- one engine, in its own process -------------------------------------------------------------

def engine_child(spec: dict) -> dict:
    engine, threads = spec["engine"], spec["threads"]
    if engine == "onnxruntime":
        import onnxruntime  # noqa: F401  (imported before the baseline reading)
    else:
        import torch

        import fusegraph as fg
        torch.set_num_threads(threads)
    vocab, seed = spec["vocab"], spec["seed"]
    work = [request_feeds(seed, i, n, vocab) for i, n in enumerate(spec["lengths"])]
    stall = [request_feeds(seed, 10_000 + i, n, vocab) for i, n in enumerate(spec["stall_lengths"])]
    save_dir = Path(spec["save_dir"]) if spec.get("save_dir") else None
    base = memory_status()
    reset_peak()

    t0 = time.perf_counter()
    model = None
    if engine == "onnxruntime":
        sess = ort_session(spec["onnx"], threads=threads)
        names = [o.name for o in sess.get_outputs()]

        def run(feeds):
            return dict(zip(names, sess.run(names, feeds)))
    else:
        if engine == "fusegraph-fgm":
            model = fg.load(spec["fgm"])
        else:
            config = fg.Config(threads=threads, **({"shape_cache": 8} if engine == "fusegraph-sc8" else {}))
            model = fg.compile(spec["onnx"], config=config)
        run = model.run
    build_s = time.perf_counter() - t0

    def keep(tag: str, out: dict) -> None:
        if save_dir is not None:
            for name, value in out.items():
                np.save(save_dir / f"{engine}.{tag}.{name}.npy", value)

    times, anon = [], []
    for i, feeds in enumerate(work):
        t = time.perf_counter()
        out = run(feeds)
        times.append((time.perf_counter() - t) * 1e3)
        if i in spec["sample_requests"]:
            keep(f"req{i}", out)
        del out
        anon.append(memory_status()["RssAnon"])
    after = memory_status()

    stalls = []
    for i, feeds in enumerate(stall):
        t = time.perf_counter()
        out = run(feeds)
        first = (time.perf_counter() - t) * 1e3
        if i in spec["sample_stalls"]:
            keep(f"stall{i}", out)
        del out
        warm = []
        for _ in range(spec["warm_runs"]):
            t = time.perf_counter()
            run(feeds)
            warm.append((time.perf_counter() - t) * 1e3)
        stalls.append({"length": feeds["input_ids"].shape[1], "first_ms": first, "warm_ms": statistics.median(warm)})
    end = memory_status()

    warm_by_length = {}
    for i, n in enumerate(spec.get("warm_lengths", [])):
        feeds = request_feeds(seed, 20_000 + i, n, vocab)
        for _ in range(2):
            run(feeds)
        warm = []
        for _ in range(spec["warm_runs"]):
            t = time.perf_counter()
            run(feeds)
            warm.append((time.perf_counter() - t) * 1e3)
        warm_by_length[str(n)] = statistics.median(warm)

    result = {"engine": engine, "build_s": build_s, "request_ms": times, "stalls": stalls,
              "warm_by_length_ms": warm_by_length,
              "memory": memory_delta(base, after, max(anon)),
              "rss_anon_after_each_request_mib": [round(a - base["RssAnon"], 1) for a in anon],
              "rss_anon_after_stalls_mib": end["RssAnon"] - base["RssAnon"],
              "vm_hwm_growth_after_stalls_mib": end["VmHWM"] - base["VmRSS"]}
    specs = getattr(model, "specializations", None)
    if specs is not None and hasattr(specs, "compiled"):
        result["per_shape_compiles"] = len(specs.compiled)
        result["per_shape_compile_s"] = sum(r["seconds"] for r in specs.compiled)
    if model is not None and getattr(model, "load_info", None):
        result["load_info"] = {k: v for k, v in model.load_info.items() if isinstance(v, (int, float, str))}
    return result


# ----- the parent: engines in turn, checks, tables ---------------------------------------------------

def summarise(runs: list[dict]) -> dict:
    """One engine's figures, each the median over its rounds."""
    rows = []
    for r in runs:
        ratios = [s["first_ms"] / s["warm_ms"] for s in r["stalls"]]
        row = {"build_s": r["build_s"], "total_s": sum(r["request_ms"]) / 1e3, **percentiles(r["request_ms"]),
               "first_request_ms": r["request_ms"][0], **r["memory"],
               "stall_median": statistics.median(ratios) if ratios else float("nan"),
               "stall_max": max(ratios) if ratios else float("nan"),
               "stall_first_ms_median": statistics.median(s["first_ms"] for s in r["stalls"]) if ratios else float("nan"),
               "stall_warm_ms_median": statistics.median(s["warm_ms"] for s in r["stalls"]) if ratios else float("nan")}
        rows.append(row)
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def check_outputs(onnx_path: str, engines: list[str], spec: dict, save_dir: Path) -> list[dict]:
    """Every saved output against onnxruntime ORT_DISABLE_ALL on the same inputs."""
    session = ort_session(onnx_path, optimized=False, threads=spec["threads"])
    names = [o.name for o in session.get_outputs()]
    cases = [(f"req{i}", request_feeds(spec["seed"], i, spec["lengths"][i], spec["vocab"]))
             for i in spec["sample_requests"]]
    cases += [(f"stall{i}", request_feeds(spec["seed"], 10_000 + i, spec["stall_lengths"][i], spec["vocab"]))
              for i in spec["sample_stalls"]]
    checks = []
    for tag, feeds in cases:
        want = dict(zip(names, session.run(names, feeds)))
        for engine in engines:
            for name in names:
                file = save_dir / f"{engine}.{tag}.{name}.npy"
                if not file.exists():
                    checks.append({"engine": engine, "case": tag, "output": name, "length": feeds["input_ids"].shape[1],
                                   "ok": False, "max_rel_err": float("nan"), "why": "no output saved"})
                    continue
                ok, err = close_enough(np.load(file), want[name])
                checks.append({"engine": engine, "case": tag, "output": name, "length": feeds["input_ids"].shape[1],
                               "ok": ok, "max_rel_err": err})
    return checks


def measure_model(onnx_path: Path, args, engines: list[str], log) -> dict:
    lengths = request_lengths(args.requests, args.min_len, args.max_len, args.seed)
    stalls = stall_lengths(args.stall_lengths, args.min_len, args.max_len, set(lengths), args.seed)
    sample_requests = sorted({0, 1, *range(20, args.requests, 20)} & set(range(args.requests)))
    spec = {"onnx": str(onnx_path), "threads": args.threads, "vocab": args.vocab, "seed": args.seed,
            "lengths": lengths, "stall_lengths": stalls, "warm_runs": args.warm_runs,
            "sample_requests": sample_requests, "sample_stalls": list(range(0, len(stalls), 6)),
            "warm_lengths": args.warm_lengths}
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory(prefix="fg-varlen-") as tmp:
        save_dir = Path(tmp)
        fgm_info = {}
        if "fusegraph-fgm" in engines:
            spec["fgm"] = str(save_dir / "model.fgm")
            fgm_info = save_fgm(str(onnx_path), spec["fgm"], args.threads)
        order = list(engines)
        for round_ in range(args.repeat):
            for engine in order:
                log(f"  {onnx_path.name}: {engine}, round {round_ + 1}/{args.repeat} (load {load_average()})")
                child = {**spec, "engine": engine, "save_dir": str(save_dir) if round_ == 0 else ""}
                runs[engine].append(run_child(__file__, child, CHILD_TIMEOUT_S))
            order.reverse()
        checks = check_outputs(str(onnx_path), engines, spec, save_dir)
    warm = {e: {str(n): statistics.median(r["warm_by_length_ms"][str(n)] for r in runs[e]) for n in args.warm_lengths}
            for e in engines}
    return {"model": str(onnx_path), "lengths": lengths, "stall_lengths": stalls, "fgm": fgm_info,
            "summary": {e: summarise(runs[e]) for e in engines}, "warm_by_length_ms": warm, "runs": runs,
            "checks": checks}


def warm_table(result: dict, engines: list[str], lengths: list[int]) -> str:
    """Warm latency per length (ms), each engine beside onnxruntime's."""
    warm = result["warm_by_length_ms"]
    ort = warm.get("onnxruntime")
    head = "| length | " + " | ".join(f"{e} ms" + (" (x ORT)" if ort and e != "onnxruntime" else "") for e in engines) + " |"
    lines = [head, "|---:|" + "---:|" * len(engines)]
    for n in lengths:
        cells = [f"{warm[e][str(n)]:.2f}" + (f" ({warm[e][str(n)] / ort[str(n)]:.2f})" if ort and e != "onnxruntime" else "")
                 for e in engines]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(result: dict, engines: list[str]) -> str:
    s = result["summary"]
    ort = s.get("onnxruntime")
    errs = {e: max((c["max_rel_err"] for c in result["checks"] if c["engine"] == e), default=float("nan"))
            for e in engines}
    misses = {e: sum(not c["ok"] for c in result["checks"] if c["engine"] == e) for e in engines}
    head = ("| engine | build / load s | total s | total / ORT | p50 ms | p99 ms | p99 / ORT | first request ms "
            "| stall median | stall max | new length: first / warm ms | RssAnon MiB | RssAnon peak MiB "
            "| VmHWM growth MiB | max rel err vs ORT_DISABLE_ALL |")
    lines = [head, "|---|" + "---:|" * (head.count("|") - 2)]
    for e in engines:
        r = s[e]
        def rel(k: str, r=r) -> str:
            return f"{r[k] / ort[k]:.2f}" if ort else "-"
        err = f"{errs[e]:.1e}" + (f" ({misses[e]} MISS)" if misses[e] else "")
        lines.append(f"| {e} | {r['build_s']:.2f} | {r['total_s']:.2f} | {rel('total_s')} | {r['p50_ms']:.1f} "
                     f"| {r['p99_ms']:.1f} | {rel('p99_ms')} | {r['first_request_ms']:.0f} | {r['stall_median']:.2f} "
                     f"| {r['stall_max']:.2f} | {r['stall_first_ms_median']:.1f} / {r['stall_warm_ms_median']:.1f} "
                     f"| {r['rss_anon_mib']:.0f} | {r['rss_anon_peak_sampled_mib']:.0f} | {r['vm_hwm_growth_mib']:.0f} "
                     f"| {err} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = child_spec(argv)
    if spec is not None:
        write_result(spec, engine_child(spec))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--layers", default="2,4", help="encoder layer counts, comma-separated (one table each)")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--positions", type=int, default=512, help="max_position_embeddings (the longest request)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warm-lengths", default="", help="lengths run warm after the traffic, comma-separated "
                                                       "(a per-length table)")
    ap.add_argument("--min-len", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stall-lengths", type=int, default=30, help="never-seen lengths for the compile-stall figure")
    ap.add_argument("--warm-runs", type=int, default=3, help="warm runs after each stall length's first")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the engines (medians over rounds)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/work/cache/shapes", help="folder the exports are kept in")
    ap.add_argument("--json", default=None, help="write every figure, every request's latency and check here")
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        ap.error(f"unknown engine(s) {bad}; choose from {', '.join(ENGINES)}")
    if not 1 <= args.min_len <= args.max_len <= args.positions:
        ap.error(f"need 1 <= --min-len <= --max-len <= --positions, got {args.min_len}, {args.max_len}, {args.positions}")
    if args.requests < 1 or args.repeat < 1 or args.warm_runs < 1 or args.stall_lengths < 0:
        ap.error("--requests, --repeat and --warm-runs must be >= 1, --stall-lengths >= 0")
    layers = [int(n) for n in args.layers.split(",") if n]
    args.warm_lengths = [int(n) for n in args.warm_lengths.split(",") if n]
    if any(not 1 <= n <= args.positions for n in args.warm_lengths):
        ap.error(f"--warm-lengths must lie in 1..{args.positions}")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = {"started": started, "machine": machine_line(), "load_start": load_average(), "args": vars(args),
           "models": []}
    failed = []
    for n in layers:
        path = export_encoder(Path(args.cache), n, args.hidden, args.heads, args.intermediate, args.vocab, args.positions)
        result = measure_model(path, args, engines, log)
        result["layers"] = n
        out["models"].append(result)
        failed += [c for c in result["checks"] if not c["ok"]]
    out["load_end"] = load_average()

    print(f"{out['machine']}\nstarted {started}, load average {out['load_start']} at start, "
          f"{out['load_end']} at end; {args.threads} threads, batch 1")
    for result in out["models"]:
        print(f"\n{Path(result['model']).name}: {result['layers']} layer(s), {args.requests} requests of lengths "
              f"{args.min_len}..{args.max_len} (seed {args.seed}); stall: {len(result['stall_lengths'])} never-seen "
              f"lengths, first run / median of {args.warm_runs} warm runs"
              + (f"; .fgm saved in {result['fgm']['save_s']:.2f} s ({result['fgm']['fgm_mib']:.0f} MiB)"
                 if result["fgm"] else ""))
        print(table(result, engines))
        if args.warm_lengths:
            print(f"\nwarm latency per length (2 runs, then the median of {args.warm_runs}; medians over rounds):")
            print(warm_table(result, engines, args.warm_lengths))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if failed:
        print(f"\nCORRECTNESS FAILURE: {len(failed)} output(s) differ from onnxruntime ORT_DISABLE_ALL "
              f"beyond rtol {RTOL} / atol {ATOL} x scale:", file=sys.stderr)
        for c in failed[:20]:
            why = c.get("why") or f"max rel err {c['max_rel_err']:.2e}"
            print(f"  {c['engine']}: {c['case']} (length {c['length']}) {c['output']}: {why}", file=sys.stderr)
        return 1
    print(f"\nall {sum(len(r['checks']) for r in out['models'])} sampled outputs match onnxruntime "
          f"ORT_DISABLE_ALL (rtol {RTOL}, atol {ATOL} x scale)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
