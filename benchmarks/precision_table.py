"""Mixed precision (issue 16): latency, accuracy, memory and load time of reduced precision
beside onnxruntime fp32 and OpenVINO f32 / bf16, one row per model, 2 threads, batch 1.

    python benchmarks/precision_table.py [--models squeezenet,bert] [--runs 20] [--precisions bf16,fp16,auto]
                                         [--no-transformers] [--no-logits] [--memory] [--inputs N]
                                         [--json out.json]

Engines: ``ort`` (onnxruntime fp32, ORT_ENABLE_ALL, ``fusegraph.tools.bench.ort_runner``), ``ov_f32``
and ``ov_bf16`` (OpenVINO on CPU, ``INFERENCE_PRECISION_HINT`` f32 / bf16, 2 threads, 1 stream,
LATENCY hint; a benchmark peer only, imported here and never by the package), ``fg_fp32``
(``fg.Config(threads=2)``) and ``fg_<p>`` for each of ``--precisions`` (default bf16,
``fg.Config(threads=2, precision=p)``). An engine that cannot be built (before reduced precision
lands, ``fg.Config(precision="bf16")`` raises ``ConfigError``; any ``FusegraphError`` while
compiling, saving or first running a fusegraph engine counts) shows "n/a" on that model and its
reason below the table; the other engines and models still run.

Models: the nine light models (``zoo.LIGHT_MODELS``, random weights ``zoo.randomize_weights``
seed 0, feeds ``zoo.random_feeds``) and, unless ``--no-transformers``, the 2-layer hidden-768
BERT / GPT-2 exports of ``tests/model_builders.py`` fixed to batch 1, sequence 128
(``static_shapes``; feeds ``transformer_feeds(seq=128)``, the last 3 positions padded). The
light models also output the input of their last Softmax (``zoo.expose_logits``, output
``logits``) so the error is measured on logits too, not only on probabilities; ``--no-logits``
keeps the models as they are.

Columns:
- *ms (x ort)*: median of ``--runs`` runs, every engine in one process, alternating blocks
  (``fusegraph.tools.bench.alternate``), and its ratio to onnxruntime fp32; the geometric mean of
  the ratios per engine is printed under the table.
- *rel-L2*: per engine, the largest over float outputs of ||y - ref|| / ||ref||, against
  onnxruntime with ORT_DISABLE_ALL on the same feeds. *top-1 differs*: engines whose arg-max
  differs from the reference's on an output that is a class vector (batch 1, one axis of
  >= 10 elements, all others 1); "-" when all agree, blank when the model has no such output.
- *fgm MiB*: size of the saved ``.fgm`` artifact per fusegraph engine.
- with ``--inputs N``, a second table: the worst rel-L2 over N inputs (seeds 0..N-1, seed 0
  the first table's), its median per engine, and per reduced fusegraph engine the inputs on
  which its error is at or below OpenVINO bf16's on the same input and the geometric mean of
  the paired ratios: one input's error through a softmax is much of it luck (an equal logit
  error moves the probabilities by as much as the input's margins allow).
- with ``--memory`` (slow: a fresh process per engine and model, as in
  ``benchmarks/private_memory.py``): *anon MiB*, RssAnon after 20 runs minus after import
  (OpenVINO: after ``import openvino`` and ``ov.Core()``); *build s*, session creation /
  ``compile_model`` / ``fg.compile``; and for fusegraph *load s* and *load anon MiB*, a
  fresh process that ``fg.load``s the ``.fgm`` the parent saved.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.tools.bench import ort_runner, alternate
from fusegraph.errors import FusegraphError

THREADS = 2
SEQ = 128
OV_PRECISION = {"ov_f32": "f32", "ov_bf16": "bf16"}


# ----- models ---------------------------------------------------------------------------------

def prepare_models(names: list[str], transformers: bool, logits: bool, tmp: Path) -> dict[str, tuple[str, Callable]]:
    """{name: (onnx path, feeds of a seed)}; light models with random weights, transformers at
    seq 128. Seed 0 gives the table's input."""
    models = {}
    for name in names:
        if name in ("bert", "gpt2"):
            continue
        proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)
        if logits:
            proto = zoo.expose_logits(proto)
        path = tmp / f"{name}.onnx"
        onnx.save(proto, str(path))
        models[name] = (str(path), lambda seed, proto=proto: zoo.random_feeds(proto, seed=seed))
    wanted = [n for n in ("bert", "gpt2") if n in names]
    if transformers and wanted:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import model_builders as mb
        (tmp / "tx").mkdir()
        for name, dynamic in mb.build_transformer_models(tmp / "tx").items():
            if name in wanted:
                path = tmp / f"{name}.onnx"
                onnx.save(mb.static_shapes(dynamic, 1, SEQ), str(path))
                models[name] = (str(path), lambda seed, mb=mb: mb.transformer_feeds(seed=seed, seq=SEQ))
    return models


# ----- engines: each builder returns (timed runner, function giving {output name: array}) ----

def ort_references(path: str, feeds: list[dict]) -> list[dict[str, np.ndarray]]:
    """The reference outputs (onnxruntime ORT_DISABLE_ALL) on each of ``feeds``, one session."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = THREADS
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, f))) for f in feeds]


def build_ort(path: str, feeds: dict, names: list[str]):
    runner = ort_runner(path, THREADS, feeds)   # runs every output, in the graph's order

    return runner, lambda other=None: dict(zip(names, runner(other)))


def ov_config(precision: str) -> dict:
    return {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": THREADS, "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY"}


def build_ov(path: str, feeds: dict, precision: str, ref_names: list[str]):
    import openvino as ov
    compiled = ov.Core().compile_model(path, "CPU", ov_config(precision))
    request = compiled.create_infer_request()
    # an output tensor may carry several names: take the reference's, else its position
    names = [min(set(o.get_names()) & set(ref_names), default=ref_names[i] if i < len(ref_names) else str(i))
             for i, o in enumerate(compiled.outputs)]

    def outputs(other=None):
        request.infer(feeds if other is None else other, share_inputs=True)
        return {n: np.array(request.get_output_tensor(i).data, copy=True) for i, n in enumerate(names)}
    return (lambda: request.infer(feeds, share_inputs=True)), outputs


def build_fg(path: str, feeds: dict, precision: str, fgm: Path):
    config = fg.Config(threads=THREADS) if precision == "fp32" else fg.Config(threads=THREADS, precision=precision)
    model = fg.compile(path, config=config)
    model.save(fgm)
    return (lambda: model.run(feeds)), (lambda other=None: {k: np.asarray(v) for k, v in
                                                           model.run(feeds if other is None else other).items()})


def build_engine(engine: str, path: str, feeds: dict, tmp: Path, model_name: str, names: list[str]):
    if engine == "ort":
        return build_ort(path, feeds, names)
    if engine in OV_PRECISION:
        return build_ov(path, feeds, OV_PRECISION[engine], names)
    return build_fg(path, feeds, engine[3:], fgm_path(tmp, model_name, engine))


def fgm_path(tmp: Path, model_name: str, engine: str) -> Path:
    return tmp / f"{model_name}.{engine}.fgm"


# ----- accuracy ---------------------------------------------------------------------------------

def rel_l2(y: np.ndarray, ref: np.ndarray) -> float:
    y, ref = np.asarray(y, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    if y.shape != ref.shape:
        return math.inf
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(y - ref)
    return float(diff / norm) if norm > 0 else float(diff)


def is_class_vector(a: np.ndarray) -> bool:
    return a.ndim >= 2 and a.shape[0] == 1 and a.size >= 10 and sorted(a.shape)[-2] == 1


def accuracy(outputs: dict, ref: dict) -> dict:
    """Per float output rel-L2, their max, and top-1 agreement on class-vector outputs."""
    errors, top1 = {}, []
    for name, r in ref.items():
        if not np.issubdtype(r.dtype, np.floating):
            continue
        y = outputs.get(name)
        errors[name] = math.inf if y is None else rel_l2(y, r)
        if y is not None and is_class_vector(r):
            top1.append(int(np.argmax(y)) == int(np.argmax(r)))
    return {"rel_l2": errors, "rel_l2_max": max(errors.values(), default=float("nan")),
            "top1_agrees": all(top1) if top1 else None}


# ----- fresh-process memory and load time (the pattern of benchmarks/private_memory.py) ----------

_CHILD = r"""
import json, sys, time
engine, path, feeds_path, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
import numpy as np
if engine == "ort":
    import onnxruntime as ort
elif engine.startswith("ov_"):
    import openvino as ov
    core = ov.Core()
else:
    import torch, fusegraph as fg
    torch.set_num_threads(threads)
feeds = dict(np.load(feeds_path))
base = rss_anon()
t0 = time.perf_counter()
if engine == "ort":
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    run = lambda: s.run(None, feeds)
elif engine.startswith("ov_"):
    c = core.compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": engine[3:], "INFERENCE_NUM_THREADS": threads,
                                         "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
    req = c.create_infer_request()
    run = lambda: req.infer(feeds, share_inputs=True)
elif engine == "fg_load":
    m = fg.load(path)
    run = lambda: m.run(feeds)
else:
    p = engine[3:]
    cfg = fg.Config(threads=threads) if p == "fp32" else fg.Config(threads=threads, precision=p)
    m = fg.compile(path, config=cfg)
    run = lambda: m.run(feeds)
build = time.perf_counter() - t0
for _ in range(20):
    run()
print(json.dumps({"build_s": build, "anon_mib": rss_anon() - base}))
"""


def fresh_process(engine: str, path: str, feeds_path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, engine, path, str(feeds_path), str(THREADS)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_memory(engines: list[str], path: str, feeds: dict, tmp: Path, model_name: str) -> dict:
    feeds_path = tmp / f"{model_name}.feeds.npz"
    np.savez(feeds_path, **feeds)
    result = {}
    for engine in engines:
        result[engine] = fresh_process(engine, path, feeds_path)
        if engine.startswith("fg_"):
            load = fresh_process("fg_load", str(fgm_path(tmp, model_name, engine)), feeds_path)
            result[engine]["load_s"] = load.get("build_s")
            result[engine]["load_anon_mib"] = load.get("anon_mib")
            if "error" in load:
                result[engine]["load_error"] = load["error"]
    return result


# ----- table ------------------------------------------------------------------------------------

def fmt(value, spec: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_table(rows: dict, engines: list[str], memory: bool, na: dict) -> dict:
    fg_engines = [e for e in engines if e.startswith("fg_")]
    head = [f"{e} ms (x ort)" for e in engines] + [f"{e} rel-L2" for e in engines] + ["top-1 differs"]
    head += [f"{e} fgm MiB" for e in fg_engines]
    if memory:
        head += [f"{e} {c}" for e in engines for c in ("anon MiB", "build s")]
        head += [f"{e} {c}" for e in fg_engines for c in ("load s", "load anon MiB")]
    print("| model | " + " | ".join(head) + " |")
    print("|---|" + "---:|" * len(head))
    for name, row in rows.items():
        lat, acc = row["latency_ms"], row["accuracy"]
        cells = [f"{lat[e]:.2f} ({lat[e] / lat['ort']:.2f}x)" if e in lat else "n/a" for e in engines]
        cells += [fmt(acc[e]["rel_l2_max"], ".1e") if e in acc else "n/a" for e in engines]
        flags = [acc[e]["top1_agrees"] for e in engines if e in acc]
        cells.append("" if all(f is None for f in flags) else
                     ", ".join(e for e in engines if e in acc and acc[e]["top1_agrees"] is False) or "-")
        cells += [fmt(row["fgm_mib"].get(e), ".1f") for e in fg_engines]
        if memory:
            mem = row.get("memory", {})
            for e in engines:
                cells += [fmt(mem.get(e, {}).get("anon_mib"), ".0f"), fmt(mem.get(e, {}).get("build_s"), ".3f")]
            for e in fg_engines:
                cells += [fmt(mem.get(e, {}).get("load_s"), ".3f"), fmt(mem.get(e, {}).get("load_anon_mib"), ".0f")]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    geomean = {}
    for e in engines:
        ratios = [r["latency_ms"][e] / r["latency_ms"]["ort"] for r in rows.values() if e in r["latency_ms"]]
        geomean[e] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    print("\ngeomean ratio to ort: " + ", ".join(f"{e} {fmt(g, '.3f')}" for e, g in geomean.items()))
    by_reason: dict[str, list[str]] = {}
    for where, reason in na.items():
        by_reason.setdefault(reason, []).append(where)
    for reason, where in by_reason.items():
        print(f"n/a {', '.join(where)}: {reason}")
    for name, row in rows.items():
        for e, m in row.get("memory", {}).items():
            for key in ("error", "load_error"):
                if key in m:
                    print(f"memory {name} {e} {key}: {m[key]}")
    return geomean


def print_inputs_table(rows: dict, engines: list[str], inputs: int) -> None:
    """Per model and engine, the median over the inputs of the worst relative L2 error; for each
    reduced fusegraph engine beside OpenVINO bf16, on how many inputs its error is at or below
    OpenVINO's (the same input) and the geometric mean of the paired ratios."""
    reduced = [e for e in engines if e.startswith("fg_") and e != "fg_fp32"]
    paired = [e for e in reduced if "ov_bf16" in engines]
    head = [f"{e} median rel-L2" for e in engines] + [f"{e} <= ov_bf16" for e in paired]
    head += [f"{e} / ov_bf16 (geomean)" for e in paired]
    print(f"\naccuracy over {inputs} inputs (seeds 0..{inputs - 1}), each against onnxruntime ORT_DISABLE_ALL")
    print("| model | " + " | ".join(head) + " |")
    print("|---|" + "---:|" * len(head))
    for name, row in rows.items():
        over = row["rel_l2_max_per_input"]
        cells = [fmt(statistics.median(over[e]), ".1e") if e in over else "n/a" for e in engines]
        pairs = {e: [(a, b) for a, b in zip(over[e], over["ov_bf16"])] if e in over and "ov_bf16" in over else []
                 for e in paired}
        cells += [f"{sum(a <= b for a, b in pairs[e])}/{len(pairs[e])}" if pairs[e] else "n/a" for e in paired]
        cells += [fmt(math.exp(statistics.fmean(math.log(a / b) for a, b in pairs[e])), ".2f")
                  if pairs[e] and all(a > 0 and b > 0 for a, b in pairs[e]) else "n/a" for e in paired]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.LIGHT_MODELS + ("bert", "gpt2")))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--precisions", default="bf16", help="fusegraph precisions besides fp32, comma-separated")
    ap.add_argument("--transformers", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--logits", action=argparse.BooleanOptionalAction, default=True,
                    help="add the light models' pre-Softmax logits as an output (zoo.expose_logits)")
    ap.add_argument("--memory", action="store_true", help="fresh-process memory and load time (slow)")
    ap.add_argument("--inputs", type=int, default=1,
                    help="accuracy also over this many inputs (seeds 0..N-1), paired per input (a second table)")
    ap.add_argument("--json", help="write the raw numbers here")
    args = ap.parse_args(argv)
    torch.set_num_threads(THREADS)
    engines = ["ort", "ov_f32", "ov_bf16", "fg_fp32"] + [f"fg_{p}" for p in args.precisions.split(",") if p]
    names = [n for n in args.models.split(",") if n]
    rows, na = {}, {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        models = prepare_models(names, args.transformers, args.logits, tmp)
        for name, (path, feeds_of) in models.items():
            feeds, *more = [feeds_of(seed) for seed in range(max(args.inputs, 1))]
            ref, *refs = ort_references(path, [feeds, *more])
            others = list(zip(more, refs))
            runners, acc, fgm_mib, over = {}, {}, {}, {}
            for engine in engines:
                try:
                    runner, outputs = build_engine(engine, path, feeds, tmp, name, list(ref))
                    acc[engine] = accuracy(outputs(), ref)
                    over[engine] = [acc[engine]["rel_l2_max"]] + [accuracy(outputs(f), r)["rel_l2_max"]
                                                                  for f, r in others]
                except FusegraphError as exc:   # ConfigError: reduced precision not implemented (yet)
                    first_line = (str(exc).splitlines() or [""])[0][:300]
                    na.setdefault(f"{engine} ({name})", f"{type(exc).__name__}: {first_line}")
                    continue
                runners[engine] = runner
                if engine.startswith("fg_"):
                    fgm_mib[engine] = fgm_path(tmp, name, engine).stat().st_size / 2**20
            samples = alternate(runners, runs=args.runs)
            row = {"latency_ms": {e: statistics.median(s) for e, s in samples.items()}, "accuracy": acc,
                   "fgm_mib": fgm_mib, "runs": args.runs, "rel_l2_max_per_input": over}
            row["ratio_to_ort"] = {e: v / row["latency_ms"]["ort"] for e, v in row["latency_ms"].items()}
            del runners
            if args.memory:
                row["memory"] = measure_memory([e for e in engines if e in row["latency_ms"]], path, feeds, tmp, name)
            rows[name] = row
            print(f"# {name}: " + " ".join(f"{e}={v:.2f}ms" for e, v in row["latency_ms"].items()),
                  file=sys.stderr, flush=True)
        geomean = print_table(rows, engines, args.memory, na)
        if args.inputs > 1:
            print_inputs_table(rows, engines, args.inputs)
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": THREADS, "runs": args.runs, "engines": engines,
                                               "models": rows, "geomean_ratio_to_ort": geomean, "n/a": na},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
