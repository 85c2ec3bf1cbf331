"""The architecture zoo (issue 40) through fusegraph, onnxruntime and OpenVINO: latency, bf16
accuracy, private memory, build / load time and fusegraph's kernel census, one row per model.

    flock /tmp/fusegraph-bench.lock python benchmarks/zoo_table.py [--models a,b] [--cache DIR]
        [--runs 20] [--inputs 8] [--no-memory] [--no-profile] [--json out.json] [--markdown out.md]

Models: ``fusegraph.testing.architectures`` (built into ``--cache`` if missing, each export
checked against PyTorch when built). Engines, 2 threads, batch 1, all in ONE process:
``ort`` (onnxruntime fp32, ORT_ENABLE_ALL, 2 intra-op threads), ``ov_f32`` / ``ov_bf16``
(OpenVINO CPU, ``INFERENCE_PRECISION_HINT``, latency hint, one stream; a peer only, never a
dependency of the package), ``fg_fp32`` (``fg.Config(threads=2)``) and ``fg_bf16``
(``precision="bf16"``). The builders and accuracy helpers are ``benchmarks/precision_table.py``'s.

Per model:
- latency: the median of ``--runs`` runs per engine after a warm-up, engines in alternating
  blocks with a pause before each (``fusegraph.tools.bench.alternate``, so onnxruntime's spinning
  pool does not tax the next engine); the ratio of each to onnxruntime fp32 and their
  geometric means per column;
- build: onnxruntime session creation, OpenVINO ``compile_model``, ``fg.compile``, and the
  ``.fgm`` ``model.save`` and ``fg.load`` (in this warm process);
- accuracy: per engine, the relative L2 error of its outputs (the largest over float outputs)
  against onnxruntime ORT_DISABLE_ALL fp32 (the oracle), median over ``--inputs`` random
  inputs (seeds 0..N-1); fusegraph bf16 also against fusegraph fp32;
- memory (unless ``--no-memory``): RssAnon after 20 runs minus after import, in a fresh
  process per engine and model (``precision_table.measure_memory``), and for fusegraph a fresh
  process that loads the ``.fgm`` (its load time and RssAnon);
- kernel census of each fusegraph engine (``model.report.kernels``): kernels per oneDNN
  implementation name, grouped into classes (jit, brgemm, gemm fallback, portable, other),
  and every declined node with its op and reason;
- where fusegraph fp32 / bf16 spend their time (unless ``--no-profile``): the top ops of
  ``fusegraph.tools.profile`` (per-node medians over 10 runs).

An engine that fails to build or run on a model is recorded with its error message (in the
table and the JSON) and the rest go on. The header gives the date, ``lscpu``'s model and ISA
flags, the command, and the load average at the start and end of the run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import fusegraph as fg
from fusegraph.tools.bench import alternate
from fusegraph.testing import architectures as zoo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precision_table as pt  # a sibling benchmark script: its engine builders and accuracy)

THREADS = pt.THREADS
ENGINES = ("ort", "ov_f32", "ov_bf16", "fg_fp32", "fg_bf16")
FG_ENGINES = ("fg_fp32", "fg_bf16")
CLASSES = ("jit", "brgemm", "gemm", "portable", "other")
FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8", "avx2")


# ----- the machine -----------------------------------------------------------------------------

def machine() -> dict:
    """lscpu's model name and the ISA flags that decide oneDNN's kernels."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return {"model": fields.get("Model name", "?").strip(), "flags": {f: f in flags for f in FLAGS},
            "cpus": os.cpu_count()}


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


# ----- engines -----------------------------------------------------------------------------------

def build_fg(path: str, feeds: dict, precision: str, fgm: Path) -> tuple:
    """(runner, outputs(other feeds), model, times): compile, save and load timed apart."""
    config = fg.Config(threads=THREADS) if precision == "fp32" else fg.Config(threads=THREADS, precision=precision)
    t0 = time.perf_counter()
    model = fg.compile(path, config=config)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.save(fgm)
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = fg.load(fgm)
    load_s = time.perf_counter() - t0
    del loaded

    def outputs(other=None):
        return {k: np.asarray(v) for k, v in model.run(feeds if other is None else other).items()}
    return (lambda: model.run(feeds)), outputs, model, {"build_s": compile_s, "save_s": save_s, "load_s": load_s}


def build_engine(engine: str, path: str, feeds: dict, tmp: Path, name: str, ref_names: list[str]) -> tuple:
    """(runner, outputs, fusegraph model or None, times) for one engine."""
    if engine.startswith("fg_"):
        return build_fg(path, feeds, engine[3:], pt.fgm_path(tmp, name, engine))
    t0 = time.perf_counter()
    if engine == "ort":
        runner, outputs = pt.build_ort(path, feeds, ref_names)
    else:
        runner, outputs = pt.build_ov(path, feeds, pt.OV_PRECISION[engine], ref_names)
    return runner, outputs, None, {"build_s": time.perf_counter() - t0}


def error_text(exc: BaseException) -> str:
    """The exception's type and message on one line (OpenVINO's first line only says where)."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:600]}"


# ----- kernel census ---------------------------------------------------------------------------

def impl_class(impl: str) -> str:
    """oneDNN implementation name -> jit | brgemm | gemm | portable | other."""
    name = impl.lower()
    if name == "portable":
        return "portable"
    if name.startswith("sgemm"):
        return "jit"           # dnnl_sgemm's JIT kernels over a plain weight (run-time rows)
    if "gemm" in name and "brg" not in name:
        return "gemm"          # x64:gemm:jit and friends: im2col + a GEMM, the fallback path
    if "brg" in name or "brdgmm" in name:
        return "brgemm"        # brgconv, brg matmul, brdgmm_dw (batch-reduce depthwise)
    if "jit" in name:
        return "jit"
    return "other"             # reference (ref:any), simple reorders, anything new


def census(kernels: dict) -> dict:
    impls = dict(kernels.get("implementations") or {})
    classes = {c: 0 for c in CLASSES}
    for impl, n in impls.items():
        classes[impl_class(impl)] += n
    declined = list(kernels.get("declined") or [])
    return {"backend": kernels.get("backend"), "total": sum(impls.values()), "classes": classes,
            "implementations": impls, "declined": declined}


def top_ops(model, feeds: dict, n: int = 5) -> list[dict]:
    """The ops fusegraph spends most of its run in (per-node medians of 10 profiled runs)."""
    from fusegraph.tools.profile import profile
    prof = profile(model, feeds, runs=10)
    rows = prof.by_op()
    total = sum(us for _, _, us in rows) or 1.0
    return [{"op": op, "nodes": count, "us": us, "share": us / total} for op, count, us in rows[:n]]


# ----- one model -------------------------------------------------------------------------------

def measure(name: str, args, tmp: Path, log) -> dict:
    row: dict = {"name": name, "errors": {}}
    try:
        path = str(zoo.build(name, args.cache))
    except Exception as exc:  # noqa: BLE001 - a zoo entry that cannot be built is a finding
        row["errors"]["build"] = error_text(exc)
        return row
    meta = zoo.manifest(name, args.cache)
    row.update(source=meta["source"], parameters=meta["parameters"], onnx_mib=meta["bytes"] / 2**20,
               onnx_nodes=meta["nodes"], inputs=meta["inputs"], path=path)
    all_feeds = [zoo.feeds(name, seed) for seed in range(max(args.inputs, 1))]
    refs = pt.ort_references(path, all_feeds)
    ref_names = list(refs[0])
    runners, outputs, models, build = {}, {}, {}, {}
    for engine in args.engines:
        try:
            runner, outs, model, times = build_engine(engine, path, all_feeds[0], tmp, name, ref_names)
            outs()                                   # the first run, untimed
        except Exception as exc:  # noqa: BLE001 - any engine's failure is recorded, the rest go on
            row["errors"][engine] = error_text(exc)
            log(f"  {engine}: {row['errors'][engine]}")
            continue
        runners[engine], outputs[engine], build[engine] = runner, outs, times
        if model is not None:
            models[engine] = model
    row["build"] = build
    # accuracy: every engine against the oracle, bf16 also against fusegraph fp32, per input
    per_input: dict[str, list[float]] = {e: [] for e in outputs}
    vs_fg32: list[float] = []
    for f, ref in zip(all_feeds, refs):
        got = {}
        for engine, outs in list(outputs.items()):
            try:
                got[engine] = outs(f)
            except Exception as exc:  # noqa: BLE001 - an engine that fails on one input is dropped
                row["errors"][engine] = error_text(exc)
                runners.pop(engine, None)
                outputs.pop(engine)
                per_input.pop(engine)
                continue
            per_input[engine].append(pt.accuracy(got[engine], ref)["rel_l2_max"])
        if "fg_bf16" in got and "fg_fp32" in got:
            vs_fg32.append(pt.accuracy(got["fg_bf16"], got["fg_fp32"])["rel_l2_max"])
    row["rel_l2_per_input"] = per_input
    row["rel_l2_median"] = {e: statistics.median(v) for e, v in per_input.items() if v}
    row["fg_bf16_vs_fg_fp32_median"] = statistics.median(vs_fg32) if vs_fg32 else None
    # latency: all engines alternating in this process
    if "ort" in runners:
        samples = alternate(runners, runs=args.runs)
        row["latency_ms"] = {e: statistics.median(s) for e, s in samples.items()}
        row["ratio_to_ort"] = {e: v / row["latency_ms"]["ort"] for e, v in row["latency_ms"].items()}
    else:
        row["latency_ms"] = {e: statistics.median(s) for e, s in alternate(runners, runs=args.runs).items()}
        row["ratio_to_ort"] = {}
    row["census"] = {e: census(m.report.kernels) for e, m in models.items()}
    row["kernel_count"] = {e: m.report.kernel_count for e, m in models.items()}
    if args.profile:
        row["top_ops"] = {}
        for e, m in models.items():
            try:
                row["top_ops"][e] = top_ops(m, all_feeds[0])
            except Exception as exc:  # noqa: BLE001 - the profile is extra; its failure is noted
                row["errors"][f"{e} profile"] = error_text(exc)
    del runners, outputs, models
    if args.memory:
        row["memory"] = pt.measure_memory([e for e in args.engines if e in row["latency_ms"]], path,
                                          all_feeds[0], tmp, name)
    return row


# ----- tables ----------------------------------------------------------------------------------

def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def f(value, spec: str = ".2f") -> str:
    return pt.fmt(value, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


def latency_table(rows: list[dict]) -> list[str]:
    head = ["model", "ort fp32 ms", "fg fp32 (x ort)", "ov f32 (x ort)", "fg bf16 (x ort)", "ov bf16 (x ort)",
            "fg bf16 / ov bf16", "fg kernels"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    cols: dict[str, list] = {k: [] for k in ("fg_fp32", "ov_f32", "fg_bf16", "ov_bf16", "pair")}
    for r in rows:
        lat, rt = r.get("latency_ms", {}), r.get("ratio_to_ort", {})
        pair = ratio(lat.get("fg_bf16"), lat.get("ov_bf16"))
        for k in ("fg_fp32", "ov_f32", "fg_bf16", "ov_bf16"):
            cols[k].append(rt.get(k))
        cols["pair"].append(pair)
        cells = [r["name"], f(lat.get("ort"))]
        for k in ("fg_fp32", "ov_f32", "fg_bf16", "ov_bf16"):
            cells.append(f"{lat[k]:.2f} ({rt[k]:.2f})" if k in lat and k in rt else _failed(r, k))
        cells += [f(pair), str(r.get("kernel_count", {}).get("fg_fp32", "n/a"))]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| **geomean** | | " + " | ".join(f"**{f(geomean(cols[k]))}**" for k in
                                                 ("fg_fp32", "ov_f32", "fg_bf16", "ov_bf16", "pair")) + " | |")
    return lines


def _failed(row: dict, engine: str) -> str:
    return "**failed**" if engine in row.get("errors", {}) else "n/a"


def accuracy_table(rows: list[dict], inputs: int) -> list[str]:
    head = ["model", "fg fp32 vs oracle", "ov f32 vs oracle", "fg bf16 vs oracle", "ov bf16 vs oracle",
            "fg bf16 / ov bf16", "fg bf16 vs fg fp32"]
    lines = [(f"relative L2 error, the largest over float outputs, median over {inputs} inputs; oracle: "
              "onnxruntime ORT_DISABLE_ALL fp32"), "", "| " + " | ".join(head) + " |",
             "|---|" + "---:|" * (len(head) - 1)]
    pairs = []
    for r in rows:
        med = r.get("rel_l2_median", {})
        pair = ratio(med.get("fg_bf16"), med.get("ov_bf16"))
        pairs.append(pair)
        cells = [r["name"]] + [f(med.get(e), ".1e") if e in med else _failed(r, e)
                               for e in ("fg_fp32", "ov_f32", "fg_bf16", "ov_bf16")]
        cells += [f(pair), f(r.get("fg_bf16_vs_fg_fp32_median"), ".1e")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"| **geomean** | | | | | **{f(geomean(pairs))}** | |")
    return lines


def cost_table(rows: list[dict]) -> list[str]:
    head = ["model", "ort RssAnon MiB", "fg fp32", "fg fp32 loaded", "fg bf16", "fg bf16 loaded", "ov f32", "ov bf16",
            "ort session s", "fg compile s fp32 / bf16", ".fgm save s fp32", ".fgm load s fp32 (warm / fresh)",
            "fresh load / ort session", "ov compile s f32 / bf16"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        mem, b = r.get("memory", {}), r.get("build", {})

        def anon(e, key="anon_mib", mem=mem):
            return f(mem.get(e, {}).get(key), ".0f")

        def bs(e, key="build_s", b=b):
            return b.get(e, {}).get(key)
        fresh_load = mem.get("fg_fp32", {}).get("load_s")
        fresh_ort = mem.get("ort", {}).get("build_s")
        cells = [r["name"], anon("ort"), anon("fg_fp32"), anon("fg_fp32", "load_anon_mib"), anon("fg_bf16"),
                 anon("fg_bf16", "load_anon_mib"), anon("ov_f32"), anon("ov_bf16"), f(bs("ort"), ".3f"),
                 f"{f(bs('fg_fp32'), '.1f')} / {f(bs('fg_bf16'), '.1f')}", f(bs("fg_fp32", "save_s"), ".3f"),
                 f"{f(bs('fg_fp32', 'load_s'), '.3f')} / {f(fresh_load, '.3f')}", f(ratio(fresh_load, fresh_ort)),
                 f"{f(bs('ov_f32'), '.2f')} / {f(bs('ov_bf16'), '.2f')}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def census_table(rows: list[dict], engine: str) -> list[str]:
    head = ["model", "kernels", *CLASSES, "declined", "implementations", f"top ops by time ({engine})"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(CLASSES) + 2) + "---|---|"]
    for r in rows:
        c = r.get("census", {}).get(engine)
        if c is None:
            lines.append(f"| {r['name']} | {_failed(r, engine)} |" + " |" * (len(head) - 2))
            continue
        impls = ", ".join(f"{k} {v}" for k, v in sorted(c["implementations"].items(), key=lambda kv: -kv[1]))
        tops = ", ".join(f"{t['op']} {t['share']:.0%}" for t in r.get("top_ops", {}).get(engine, [])
                         if t["share"] >= 0.01)
        cells = [r["name"], str(c["total"]), *(str(c["classes"][k]) for k in CLASSES), str(len(c["declined"])),
                 impls, tops]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def declines_by_reason(rows: list[dict], engine: str) -> list[str]:
    grouped: dict[str, dict] = {}
    for r in rows:
        for d in r.get("census", {}).get(engine, {}).get("declined", []):
            g = grouped.setdefault(d["reason"], {"count": 0, "ops": {}, "models": {}})
            g["count"] += 1
            g["ops"][d["op"]] = g["ops"].get(d["op"], 0) + 1
            g["models"][r["name"]] = g["models"].get(r["name"], 0) + 1
    lines = []
    for reason, g in sorted(grouped.items(), key=lambda kv: -kv[1]["count"]):
        ops = ", ".join(f"{k} {v}" for k, v in sorted(g["ops"].items(), key=lambda kv: -kv[1]))
        models = ", ".join(f"{k} {v}" for k, v in sorted(g["models"].items(), key=lambda kv: -kv[1]))
        lines.append(f"- **{g['count']}x** \"{reason}\" — ops: {ops}; models: {models}")
    return lines or ["- none"]


def failures(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        for where, message in r.get("errors", {}).items():
            lines.append(f"- {r['name']} / {where}: `{message}`")
        for e, m in r.get("memory", {}).items():
            for key in ("error", "load_error"):
                if key in m:
                    lines.append(f"- {r['name']} / fresh-process {e} {key}: `{m[key]}`")
    return lines or ["- none"]


def markdown(rows: list[dict], header: dict, args) -> str:
    cpu = header["machine"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
    out = [f"`{header['command']}`", "",
           (f"{header['started']} to {header['finished']}; CPU: {cpu['model']} ({flags}); {THREADS} threads, "
            f"batch 1; torch {torch.__version__}, onnxruntime {header['versions']['onnxruntime']}, "
            f"OpenVINO {header['versions']['openvino']}; load average at the start {header['load_start']}, "
            f"at the end {header['load_end']}."), "",
           f"### Latency (median of {args.runs} runs, alternating in one process; ratio to onnxruntime fp32)", "",
           *latency_table(rows), "", "### bf16 accuracy", "", *accuracy_table(rows, args.inputs), ""]
    if args.memory:
        out += ["### Private memory and build / load time", "",
                ("RssAnon after 20 runs minus after import, fresh process per engine and model (MiB); "
                 "\"loaded\": a fresh process that `fg.load`s the `.fgm`. Build times in this process "
                 "(warm), the fresh `.fgm` load beside onnxruntime's fresh session creation."), "",
                *cost_table(rows), ""]
    for e in FG_ENGINES:
        if e in args.engines:
            out += [f"### Kernel census ({e}, `model.report.kernels`)", "", *census_table(rows, e), "",
                    f"Declined nodes ({e}) by reason:", "", *declines_by_reason(rows, e), ""]
    out += ["### Failures", "", *failures(rows), ""]
    return "\n".join(out)


def render(json_path: str, markdown_path: str | None) -> int:
    saved = json.loads(Path(json_path).read_text())
    header, rows = saved["header"], saved["rows"]
    for r in rows:
        r["census"] = {e: census({"backend": c.get("backend"), "implementations": c["implementations"],
                                  "declined": c["declined"]}) for e, c in r.get("census", {}).items()}
    opts = header.get("options")
    if opts is None:                        # a JSON from before the options were saved: its command line
        ran = parser().parse_args(header["command"].split()[2:])
        opts = {"runs": ran.runs, "inputs": ran.inputs, "engines": ran.engines.split(",")}
    args = argparse.Namespace(runs=opts["runs"], inputs=opts["inputs"], memory=any("memory" in r for r in rows),
                              engines=list(opts["engines"]))
    header.setdefault("finished", "(unfinished)")
    header.setdefault("load_end", "(unfinished)")
    text = markdown(rows, header, args)
    print(text)
    if markdown_path:
        Path(markdown_path).write_text(text)
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.zoo_names()), help="comma-separated zoo entries")
    ap.add_argument("--cache", default=None, help="zoo export cache (default $FUSEGRAPH_ZOO_CACHE or "
                                                  "~/.cache/fusegraph/zoo)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--inputs", type=int, default=8, help="random inputs for the accuracy medians")
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                    help="fresh-process RssAnon and load time per engine (slow)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                    help="fusegraph's top ops by time per model")
    ap.add_argument("--json", help="write everything here")
    ap.add_argument("--markdown", help="write the tables here too")
    ap.add_argument("--render", metavar="JSON", help="measure nothing: print the tables of an earlier --json "
                                                     "(the census classes recomputed from its implementations)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.render:
        return render(args.render, args.markdown)
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(args.engines) - set(ENGINES))
    if unknown or "ort" not in args.engines:
        ap.error(f"engines must include ort and be among {', '.join(ENGINES)}; unknown: {unknown}")
    names = [n for n in args.models.split(",") if n]
    for n in names:
        zoo.entry(n)                             # an unknown name fails before any work
    torch.set_num_threads(THREADS)
    import onnxruntime
    try:
        import openvino
        ov_version = openvino.__version__
    except ImportError:
        ov_version = "not installed"
    header = {"command": " ".join(["python", "benchmarks/zoo_table.py", *(argv if argv is not None else sys.argv[1:])]),
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_start": loadavg(),
              "machine": machine(), "versions": {"onnxruntime": onnxruntime.__version__, "openvino": ov_version},
              "options": {"runs": args.runs, "inputs": args.inputs, "engines": args.engines}}
    print(f"# {header['started']}, load average {header['load_start']}", file=sys.stderr, flush=True)
    rows = []

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        for name in names:
            t0 = time.perf_counter()
            row = measure(name, args, Path(tmp_name), log)
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            lat = row.get("ratio_to_ort", {})
            log(f"# {name} ({row['seconds']:.0f} s): " + " ".join(f"{e}={v:.2f}" for e, v in lat.items())
                + (f" errors: {row['errors']}" if row["errors"] else ""))
            if args.json:                         # written as it goes: a long run keeps what it measured
                Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=str))
    header["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    header["load_end"] = loadavg()
    text = markdown(rows, header, args)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
