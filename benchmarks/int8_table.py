"""int8 on onnxruntime-quantised (QDQ) models (issue 37): latency, private memory, build time and
error beside onnxruntime fp32 / int8 and OpenVINO int8, one row per model, 2 threads, batch 1.

    flock /tmp/fusegraph-bench.lock python benchmarks/int8_table.py [--models squeezenet,resnet50,bert]
        [--runs 30] [--cache DIR] [--calibration 16] [--no-memory] [--json out.json]
    flock /tmp/fusegraph-bench.lock python benchmarks/int8_table.py --quantisation dynamic
        [--per-channel] --models bert,gpt2
    flock /tmp/fusegraph-bench.lock python benchmarks/int8_table.py --quantisation ptq
        [--models resnet50,squeezenet,bert] [--agreement 16]

Models: the light models named in ``--models`` (``zoo.light_model_path``, random weights
``zoo.randomize_weights`` seed 0, logits exposed by ``zoo.expose_logits``, converted to
opset 13 (per-channel QDQ needs DequantizeLinear's axis), feeds ``zoo.random_feeds``) and ``bert``: a 4-layer hidden-768 BERT with random weights exported by
``tests/model_builders.py`` (called with keyword arguments), fixed to batch 1, sequence 128
(feeds ``transformer_feeds``), and ``gpt2``: its 4-layer hidden-768 GPT-2 the same way; a
name of the architecture zoo (``fusegraph.testing.architectures``, e.g. ``mobilenet_v2``:
MobileNetV2 as ``transformers`` builds it, 224 x 224) is its cached export (``--zoo-cache``)
with ``architectures.feeds``. Each is quantised once into ``--cache`` (default
``~/.cache/fusegraph/int8``; reused when present) by onnxruntime's ``quantize_static``: QDQ,
per-channel int8 weights, uint8 activations, MinMax over ``--calibration`` inputs (seeds
1000..), after onnxruntime's ``quant_pre_process`` (its recommended first step: shape
inference and its basic graph optimisations, Conv + BatchNormalization fused; without it every
BatchNormalization stays a float op between a dequantise and a quantise), so every int8 engine
runs the same file; in BERT only the MatMul / Gemm ops
(``TRANSFORMER_OPS``: the default quantises the attention mask's Add too, and loses it).
``--quantisation dynamic`` instead quantises by onnxruntime's ``quantize_dynamic`` (int8
weights, per tensor, or per column with ``--per-channel``; activations quantised at run time
by DynamicQuantizeLinear; no calibration): the transformers' products with constant weights
become ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul``, fusegraph's QLinearDynamic.
``--quantisation ptq`` adds fusegraph's own post-training quantisation (``fg_ptq``:
``fg.compile(fp32 file, Config(precision="int8"), calibration_inputs=...)`` with the same
``--calibration`` inputs onnxruntime's ``quantize_static`` calibrated on, MinMax) beside
fusegraph on onnxruntime's QDQ file (``fg_int8``) and onnxruntime int8, without OpenVINO; its
*build s* is that compile, calibration included, in this process, and its *anon MiB* the fresh
process that loads the ``.fgm`` it saved (*fgm MiB*: that file's size beside ``fg_fp32``'s).
Every int8 engine's *top-1* is its agreement with onnxruntime ORT_DISABLE_ALL on the fp32 file
over ``--agreement`` fresh inputs (seeds 2000..; the argmax of each row of the output's last
axis: the light models' logits, BERT's last hidden state per token).

Engines (all in one process, alternating blocks, ``fusegraph.tools.bench.alternate``; median of
``--runs``): ``ort_fp32`` (onnxruntime ORT_ENABLE_ALL on the fp32 file), ``fg_fp32``
(``fg.compile`` of the fp32 file), ``ort_int8`` (onnxruntime ORT_ENABLE_ALL on the QDQ file),
``ov_int8`` (OpenVINO ``compile_model(QDQ file, "CPU")``, 2 threads, 1 stream, LATENCY hint,
f32 for what it does not run in int8 (as in the fresh process); a
benchmark peer only, never imported by the package), ``fg_int8`` (``fg.compile`` of the QDQ file).

Columns: *ms* (median) and its ratio to onnxruntime fp32 (geomean under the table); *rel-L2*
of the int8 engines' ``logits`` output (the light models'; BERT: its first, the last hidden
state) against onnxruntime
ORT_DISABLE_ALL on the fp32 file, on seed 0's input; *anon MiB*: RssAnon after 20 runs minus
after import, one fresh process per engine and model (``precision_table.fresh_process``);
*build s*: session creation / ``compile_model`` / ``fg.compile`` in that process.
``--no-memory`` skips the fresh processes. An engine that fails to build shows "n/a" and its
reason below the table.
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
import onnx
from onnx import version_converter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precision_table as pt                      # noqa: E402 - the sibling benchmark's helpers

from fusegraph.testing import architectures, zoo  # noqa: E402
from fusegraph.tools.bench import alternate, ort_runner   # noqa: E402

THREADS = 2
SEQ = 128
BERT_LAYERS = 4
QDQ_OPSET = 13
TRANSFORMERS = ("bert", "gpt2")
# quantised in a transformer: its products only. quantize_static's default also quantises every
# Add, the attention mask's (-3.4e38 where masked) included, and that uint8 range wipes out the
# scores: the last hidden state's relative L2 was 0.38 on every int8 engine, 0.034 this way
TRANSFORMER_OPS = ("MatMul", "Gemm")
ENGINES = ("ort_fp32", "fg_fp32", "ort_int8", "ov_int8", "fg_int8")
PTQ_ENGINES = ("ort_fp32", "fg_fp32", "ort_int8", "fg_int8", "fg_ptq")
# the engine name the fresh-process child of precision_table knows, and which file it reads
CHILD_ENGINE = {"ort_fp32": ("ort", "fp32"), "fg_fp32": ("fg_fp32", "fp32"), "ort_int8": ("ort", "int8"),
                "ov_int8": ("ov_f32", "int8"), "fg_int8": ("fg_fp32", "int8")}


# ----- models and their quantisation --------------------------------------------------------------

def fp32_model(name: str, cache: Path, zoo_cache: str | None = None) -> tuple[Path, callable]:
    """(path of the fp32 model in ``cache``, feeds of a seed)."""
    path = cache / f"{name}_fp32.onnx"
    if name not in zoo.LIGHT_MODELS and name in architectures.zoo_names():
        if not path.exists():
            onnx.save(onnx.load(str(architectures.build(name, zoo_cache))), str(path))
        return path, lambda seed: architectures.feeds(name, seed)
    if name in TRANSFORMERS:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import model_builders as mb
        if not path.exists():
            with tempfile.TemporaryDirectory() as tmp:
                exported = mb.build_transformer_models(Path(tmp), layers=BERT_LAYERS, positions=SEQ)[name]
                onnx.save(mb.static_shapes(exported, 1, SEQ), str(path))
        return path, lambda seed: mb.transformer_feeds(seed=seed, seq=SEQ)
    proto = zoo.expose_logits(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0))
    if proto.opset_import[0].version < QDQ_OPSET:   # per-channel QDQ needs DequantizeLinear's axis
        proto = version_converter.convert_version(proto, QDQ_OPSET)
    # IR 3 lists every initialiser as a graph input; onnxruntime's pre-processing merges equal
    # initialisers and leaves the dropped ones as inputs nobody feeds (shufflenet's Reshape shapes)
    inits = {i.name for i in proto.graph.initializer}
    real = [i for i in proto.graph.input if i.name not in inits]
    del proto.graph.input[:]
    proto.graph.input.extend(real)
    proto.ir_version = max(proto.ir_version, 4)
    if not path.exists():
        onnx.save(proto, str(path))
    return path, lambda seed: zoo.random_feeds(proto, seed=seed)


def dynamic_model(name: str, fp32: Path, cache: Path, per_channel: bool) -> Path:
    """The ``quantize_dynamic`` file of ``fp32`` (made once)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    path = cache / f"{name}_dynamic{'_pc' if per_channel else ''}.onnx"
    if not path.exists():
        quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, per_channel=per_channel)
    return path


def quantised_model(name: str, fp32: Path, feeds_of, cache: Path, calibration: int) -> Path:
    """The QDQ file of ``fp32`` (made once: onnxruntime quantize_static, per channel)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    path = cache / f"{name}_qdq_c{calibration}_pre.onnx"
    if path.exists():
        return path

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([feeds_of(1000 + i) for i in range(calibration)])

        def get_next(self):
            return next(self.it, None)

    source = fp32
    if name not in TRANSFORMERS:      # onnxruntime's recommended first step: Conv + BatchNormalization fused
        from onnxruntime.quantization.shape_inference import quant_pre_process
        source = cache / f"{name}_preprocessed.onnx"
        quant_pre_process(str(fp32), str(source))
    quantize_static(str(source), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=list(TRANSFORMER_OPS) if name in TRANSFORMERS else None)
    return path


# ----- engines ----------------------------------------------------------------------------------------

_OV_CHILD = """
import sys, numpy as np, openvino as ov
feeds = dict(np.load(sys.argv[2]))
ov.Core().compile_model(sys.argv[1], "CPU", {"INFERENCE_NUM_THREADS": 2}).create_infer_request().infer(feeds)
"""


def ov_survives(path: str, feeds: dict) -> None:
    """Raise when OpenVINO crashes the process compiling or running ``path`` (tried in a child
    process first: its segfault would end the whole table)."""
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/feeds.npz", **feeds)
        out = subprocess.run([sys.executable, "-c", _OV_CHILD, path, f"{tmp}/feeds.npz"],
                             capture_output=True, text=True, check=False)
    if out.returncode < 0:
        raise RuntimeError(f"OpenVINO killed its process (signal {-out.returncode}) compiling or running this file")


def build(engine: str, fp32: Path, qdq: Path, feeds: dict, output: str, index: int, calibration=None):
    """(timed runner, function giving output ``output`` (the ``index``-th) as an array, the same
    for other feeds)."""
    path = str(qdq if engine.endswith("int8") else fp32)
    if engine == "fg_ptq":
        import fusegraph as fg
        model = fg.compile(path, config=fg.Config(threads=THREADS, precision="int8"), calibration_inputs=calibration)
        return ((lambda: model.run(feeds)), (lambda: np.asarray(model.run(feeds)[output])),
                (lambda f: np.asarray(model.run(f)[output])), model)
    if engine.startswith("ort"):
        run = ort_runner(path, THREADS, feeds)
        return run, lambda: np.asarray(run()[index]), lambda f: np.asarray(run(f)[index]), None
    if engine.startswith("ov"):
        import openvino as ov
        ov_survives(path, feeds)
        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": THREADS, "NUM_STREAMS": 1,
                                                         "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()
        run = lambda: request.infer(feeds, share_inputs=True)          # noqa: E731
        return (run, lambda: np.array(request.infer(feeds)[compiled.outputs[index]], copy=True),
                lambda f: np.array(request.infer(f)[compiled.outputs[index]], copy=True), None)
    import fusegraph as fg
    model = fg.compile(path, config=fg.Config(threads=THREADS))
    return ((lambda: model.run(feeds)), (lambda: np.asarray(model.run(feeds)[output])),
            (lambda f: np.asarray(model.run(f)[output])), model)


def top1_agreement(predict, refs: list[np.ndarray], feeds: list[dict]) -> float:
    """The share of rows (of the output's last axis) whose argmax matches the reference's."""
    agree = total = 0
    for f, r in zip(feeds, refs):
        y = predict(f)
        a, b = np.asarray(y).reshape(-1, r.shape[-1]).argmax(-1), r.reshape(-1, r.shape[-1]).argmax(-1)
        agree += int((a == b).sum())
        total += a.size
    return agree / total if total else math.nan


def int8_kernels(qdq: Path) -> dict:
    """How many of the QDQ file's products fusegraph runs as int8 ops, and on what."""
    import fusegraph as fg
    model = fg.compile(str(qdq), config=fg.Config(threads=THREADS))
    ops = [n.op_type for n in model.graph.nodes]
    return {"int8_ops": sum(op in ("QConv", "QLinear", "QAdd", "QLinearDynamic") for op in ops),
            "float_products": sum(op in ("Conv", "MatMul", "Gemm", "FusedConv", "Linear", "FusedLinear") for op in ops),
            "implementations": model.report.kernels["implementations"]}


def measure_memory(fp32: Path, qdq: Path, feeds: dict, cache: Path, name: str, engines=ENGINES) -> dict:
    feeds_path = cache / f"{name}.feeds.npz"
    np.savez(feeds_path, **feeds)
    out = {}
    for engine in engines:
        if engine == "fg_ptq":        # the saved .fgm, loaded (its compile needs the calibration inputs)
            out[engine] = pt.fresh_process("fg_load", str(cache / f"{name}_ptq.fgm"), feeds_path)
            continue
        child, which = CHILD_ENGINE[engine]
        out[engine] = pt.fresh_process(child, str(qdq if which == "int8" else fp32), feeds_path)
    return out


# ----- table ------------------------------------------------------------------------------------------

def cpu_line() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "lscpu: not available"
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("Flags")), [])
    wanted = [f for f in flags if f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")]
    return f"CPU: {model}; flags: {' '.join(wanted)}"


def _int8(e: str) -> bool:
    return e.endswith("int8") or e == "fg_ptq"


def print_table(rows: dict, memory: bool, failures: dict, files: str, engines=ENGINES) -> None:
    print(cpu_line())
    print(f"threads {THREADS}, batch 1; int8 files: {files}\n")
    ptq = "fg_ptq" in engines
    head = "| model | " + " | ".join(f"{e} ms (x ort_fp32)" for e in engines) + " | " + \
           " | ".join(f"{e} rel-L2" for e in engines if _int8(e))
    if ptq:
        head += " | " + " | ".join(f"{e} top-1" for e in engines if _int8(e)) + " | fgm MiB fg_fp32 / fg_ptq"
    if memory:
        head += " | " + " | ".join(f"{e} anon MiB / build s" for e in engines)
    print(head + " |")
    print("|---" * (head.count("|") - 0) + "|")
    ratios = {e: [] for e in engines}
    for name, row in rows.items():
        base = row["ms"].get("ort_fp32")
        cells = []
        for e in engines:
            ms = row["ms"].get(e)
            if ms is None:
                cells.append("n/a")
                continue
            r = ms / base if base else math.nan
            if not math.isnan(r):
                ratios[e].append(r)
            cells.append(f"{ms:.2f} ({r:.2f})")
        cells += [pt.fmt(row["rel_l2"].get(e), ".2e") for e in engines if _int8(e)]
        if ptq:
            cells += [pt.fmt(row["top1"].get(e), ".3f") for e in engines if _int8(e)]
            cells.append(" / ".join(pt.fmt(row["fgm_mib"].get(e), ".1f") for e in ("fg_fp32", "fg_ptq")))
        if memory:
            for e in engines:
                m = row.get("memory", {}).get(e, {})
                build = row.get("build_s", {}).get(e, m.get("build_s"))
                cells.append("n/a" if "error" in m or not m else f"{m['anon_mib']:.0f} / {build:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    geo = [f"{math.exp(statistics.fmean(math.log(x) for x in v)):.2f}" if v else "n/a" for v in ratios.values()]
    print("\ngeomean / ort_fp32: " + ", ".join(f"{e} {g}" for e, g in zip(engines, geo)))
    for name, row in rows.items():
        print(f"{name}: fusegraph int8 ops {row['kernels'].get('int8_ops')}, float products left "
              f"{row['kernels'].get('float_products')}"
              + (f"; fg_ptq int8 ops {row['ptq_kernels'].get('int8_ops')}, float products left "
                 f"{row['ptq_kernels'].get('float_products')}" if row.get("ptq_kernels") else ""))
    for (name, engine), why in failures.items():
        print(f"n/a: {name} {engine}: {why}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="squeezenet,resnet50,bert")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/fusegraph/int8"))
    ap.add_argument("--calibration", type=int, default=16)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--quantisation", choices=("static", "dynamic", "ptq"), default="static")
    ap.add_argument("--agreement", type=int, default=16, help="ptq: fresh inputs for the top-1 agreement")
    ap.add_argument("--per-channel", action="store_true", help="dynamic: int8 weights per column")
    ap.add_argument("--zoo-cache", default=None, help="the architecture zoo's export cache (default "
                                                     "$FUSEGRAPH_ZOO_CACHE or ~/.cache/fusegraph/zoo)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(THREADS)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows, failures = {}, {}
    engines = PTQ_ENGINES if args.quantisation == "ptq" else ENGINES
    for name in [m for m in args.models.split(",") if m]:
        try:
            fp32, feeds_of = fp32_model(name, cache, args.zoo_cache)
            if args.quantisation == "dynamic":
                qdq = dynamic_model(name, fp32, cache, args.per_channel)
            else:
                qdq = quantised_model(name, fp32, feeds_of, cache, args.calibration)
        except Exception as exc:   # noqa: BLE001 - a model that cannot be quantised is reported, not fatal
            failures[(name, "quantisation")] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        feeds = feeds_of(0)
        (ref,) = pt.ort_references(str(fp32), [feeds])
        names = list(ref)
        output = "logits" if "logits" in ref else names[0]     # zoo.expose_logits's output
        ref0 = ref[output]
        runners, outputs, predict, models, build_s = {}, {}, {}, {}, {}
        calibration = [feeds_of(1000 + i) for i in range(args.calibration)]   # quantised_model's inputs
        for engine in engines:
            try:
                t0 = time.perf_counter()
                runners[engine], outputs[engine], predict[engine], models[engine] = build(
                    engine, fp32, qdq, feeds, output, names.index(output), calibration)
                build_s[engine] = time.perf_counter() - t0
            except Exception as exc:   # noqa: BLE001 - a peer that fails is reported, not fatal
                failures[(name, engine)] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rel = {e: pt.rel_l2(outputs[e](), ref0) for e in outputs}
        row = rows[name] = {"rel_l2": rel, "kernels": int8_kernels(qdq) if "fg_int8" in runners else {}}
        if args.quantisation == "ptq":
            fresh = [feeds_of(2000 + i) for i in range(args.agreement)]
            refs = [r[output] for r in pt.ort_references(str(fp32), fresh)]
            row["top1"] = {e: top1_agreement(predict[e], refs, fresh) for e in predict if _int8(e)}
            row["fgm_mib"] = {}
            for e in ("fg_fp32", "fg_ptq"):
                if models.get(e) is not None:
                    models[e].save(cache / f"{name}_{e[3:]}.fgm")
                    row["fgm_mib"][e] = (cache / f"{name}_{e[3:]}.fgm").stat().st_size / 2 ** 20
            if models.get("fg_ptq") is not None:
                ops = [n.op_type for n in models["fg_ptq"].graph.nodes]
                row["ptq_kernels"] = {"int8_ops": sum(op in ("QConv", "QLinear", "QAdd", "QLinearDynamic")
                                                      for op in ops),
                                      "float_products": sum(op in ("Conv", "MatMul", "Gemm", "FusedConv", "Linear",
                                                                   "FusedLinear", "LinearAct") for op in ops)}
                row["build_s"] = {"fg_ptq": build_s["fg_ptq"]}
        samples = alternate(runners, runs=args.runs, warmup=max(2, min(5, args.runs)))
        row["ms"] = {e: statistics.median(s) for e, s in samples.items()}
        del runners, outputs, predict, models
        if not args.no_memory:
            row["memory"] = measure_memory(fp32, qdq, feeds, cache, name, engines)
    files = ("onnxruntime quantize_static QDQ, per-channel" if args.quantisation != "dynamic" else
             f"onnxruntime quantize_dynamic, int8 weights {'per column' if args.per_channel else 'per tensor'}")
    if args.quantisation == "ptq":
        files += f"; fg_ptq: fusegraph precision='int8' on the fp32 file, MinMax over the same {args.calibration} inputs"
    print_table(rows, not args.no_memory, failures, files, engines)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_line(), "threads": THREADS, "rows": rows,
                                               "failures": {f"{k[0]}/{k[1]}": v for k, v in failures.items()}},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
