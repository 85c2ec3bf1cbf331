"""``fusegraph compare MODEL --precision bf16|int8|auto``: fp32 beside a reduced precision, measured.

Both models are compiled with the same config but the precision; latency is measured in one
process, alternating (``bench.alternate``); accuracy is measured for BOTH against an
independent reference: onnxruntime with ORT_DISABLE_ALL for an ONNX model, else the fp32
graph unoptimised (O0); each side's private memory (RssAnon) with its ``.fgm`` loaded and run
once in a fresh process (``rss_probe.py``, with ``rss=True``). Read-only: neither model's
report is changed.

int8: calibrated on the ``calibration`` feeds given, else as ``int8_inputs.default_calibration``
says (random inputs of the model's specs for a model with convolutions, dynamic quantisation
otherwise); ``PrecisionComparison.calibration`` says which. The accuracy inputs (seeds 0 ..
inputs-1) are not the calibration inputs. ``auto`` gets the given calibration feeds (its int8
candidate needs them).
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..report.printable import printable
from .compare import megabytes, memory_of

@dataclass
class PrecisionSide:
    precision: str
    latency_ms: float
    p90_ms: float
    compile_s: float
    kernels: int
    arena_bytes: int | None
    artifact_bytes: int
    by_dtype: dict[str, int] = field(default_factory=dict)
    casts: int = 0
    rss_anon_bytes: int | None = None   # loaded and run once in a fresh process (None: not measured)


@dataclass
class PrecisionComparison:
    model: str
    precision: str
    reference: str          # what both sides are measured against
    inputs: int             # random inputs the accuracy figures are over
    runs: int               # timed runs per side
    threads: int
    fp32: PrecisionSide
    reduced: PrecisionSide
    # output -> {"fp32": errors vs reference, "reduced": errors vs reference,
    #            "reduced_vs_fp32": errors of the reduced model against the fp32 one}
    # (each ``compiler.accuracy.accumulate``'s: rel_l2, max_abs, cosine, inputs, top1_agree)
    accuracy: dict[str, dict[str, dict]] = field(default_factory=dict)
    kept_fp32: list[dict] = field(default_factory=list)
    fp32_logits: list[dict] = field(default_factory=list)    # bf16 operands, float32 output
    declined: str | None = None     # precision "auto" gave the fp32 model before any search: why
    calibration: str | None = None  # int8 / auto: what the reduced side was calibrated on
    baseline_rss_bytes: int | None = None   # RssAnon of a fresh process with nothing loaded

    def worst_rel_l2(self, side: str = "reduced") -> float:
        from ..compiler.accuracy import worst_rel_l2
        return worst_rel_l2({k: v[side] for k, v in self.accuracy.items()})

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


def _onnx_proto(model_src: Any):
    """The ModelProto of an ONNX source (path, bytes, ModelProto), else None."""
    import onnx
    if type(model_src).__name__ == "ModelProto":
        return model_src
    if isinstance(model_src, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model_src))
    if isinstance(model_src, (str, Path)) and Path(model_src).suffix == ".onnx" and Path(model_src).is_file():
        return onnx.load(str(model_src))
    return None


def _reference(model_src: Any, base, threads: int):
    """(name, run(feeds) -> outputs, close) of the independent reference."""
    import fusegraph as fg
    proto = _onnx_proto(model_src)
    if proto is not None:
        try:
            import onnxruntime as ort
        except ImportError:
            proto = None
    if proto is not None:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        wanted = {i.name for i in sess.get_inputs()}

        def run(feeds):
            return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in wanted})))
        return "onnxruntime (ORT_DISABLE_ALL)", run, lambda: None
    ref = fg.compile(_fresh(model_src), base.replace(level="O0", memory="off", precision="fp32", op_precision=()))
    return "fusegraph fp32 at O0", lambda feeds: ref.run(feeds), ref.close


def _fresh(model_src: Any) -> Any:
    """A source ``fg.compile`` may consume: an IR Graph is optimised in place, so each compile
    gets its own copy (through the artifact's graph serialisation); anything else is re-read."""
    from ..ir import Graph
    from ..ir.serialize import copy_graph
    return copy_graph(model_src) if isinstance(model_src, Graph) else model_src


def _p90(samples: list[float]) -> float:
    import numpy as np
    return float(np.percentile(samples, 90))


def compare_precision(model_src: Any, precision: str = "bf16", inputs: int = 8, runs: int = 20,
                      config=None, op_precision=(), calibration: list[dict] | None = None,
                      calibration_method: str = "minmax", rss: bool = False) -> PrecisionComparison:
    """fp32 beside ``precision`` (``op_precision``: overrides of the reduced side only): latency
    (alternating, one process), planned arena, .fgm size, (``rss``) RssAnon, and per output the
    errors of both against the reference over ``inputs`` random inputs (seeds 0 .. inputs-1).
    ``calibration``: int8's / auto's calibration feeds; ``calibration_method``: int8's."""
    import statistics

    import numpy as np
    import torch

    import fusegraph as fg

    from .bench import alternate
    from ..errors import UsageError
    from ..compiler.accuracy import accumulate, output_errors
    from ..runtime.feeds import random_feeds

    if precision == "fp32":
        raise UsageError("compare --precision sets the reduced side (bf16, fp16, int8 or auto); the other side "
                         "is always fp32")
    if calibration is not None and precision not in ("int8", "auto"):
        raise UsageError(f"compare: calibration inputs apply to --precision int8 or auto; {precision} uses none")
    if inputs < 1 or runs < 1:
        raise UsageError(f"compare --precision needs at least one input and one run, got inputs={inputs}, "
                         f"runs={runs}")
    given = config or fg.Config()
    budget = fg.Config().accuracy_budget        # read by precision "auto" only
    base = given.replace(precision="fp32", op_precision=(), accuracy_budget=budget)
    reduced_cfg = given.replace(precision=precision, op_precision=op_precision,
                                accuracy_budget=given.accuracy_budget if precision == "auto" else budget,
                                calibration=calibration_method if precision == "int8" else "minmax")
    threads = base.threads or torch.get_num_threads()
    calibrated, how = calibration, None
    if precision == "int8":
        from ..compiler.driver import import_model
        from .int8_inputs import default_calibration
        calibrated, how = default_calibration(import_model(_fresh(model_src)), calibration)
        if calibrated is not None:
            how += f"; ranges by {calibration_method}"
    elif precision == "auto":
        how = (f"{len(calibration)} calibration input(s) given" if calibration is not None else
               "no calibration inputs: the search measures on random inputs, and int8 is not a candidate")
    models, compile_s = {}, {}
    ref_close = lambda: None
    try:
        for key, cfg in (("fp32", base), ("reduced", reduced_cfg)):
            t0 = time.perf_counter()
            models[key] = fg.compile(_fresh(model_src), cfg, calibration_inputs=None if key == "fp32" else calibrated)
            compile_s[key] = time.perf_counter() - t0
        fp32, red = models["fp32"], models["reduced"]
        reduced_prec = red.report.precision or {}
        ref_name, ref_run, ref_close = _reference(model_src, base, threads)
        errors: dict[str, list] = {"fp32": [], "reduced": [], "reduced_vs_fp32": []}
        for seed in range(inputs):
            feeds = random_feeds(fp32.inputs, seed=seed)
            want = {k: np.asarray(v) for k, v in ref_run(feeds).items()}
            got32 = {k: np.asarray(v) for k, v in fp32.run(feeds).items()}
            gotr = {k: np.asarray(v) for k, v in red.run(feeds).items()}
            errors["fp32"].append(output_errors(got32, want))
            errors["reduced"].append(output_errors(gotr, want))
            errors["reduced_vs_fp32"].append(output_errors(gotr, got32))
        folded = {k: accumulate(v) for k, v in errors.items()}
        accuracy = {name: {k: folded[k][name] for k in folded if name in folded[k]} for name in folded["fp32"]}
        f0 = random_feeds(fp32.inputs, seed=0)
        samples = alternate({"fp32": lambda: fp32.run(f0), "reduced": lambda: red.run(f0)},
                            runs=runs, warmup=2)
        sides = {}
        baseline = None
        with tempfile.TemporaryDirectory() as tmp:
            if rss:
                from .rss_probe import rss_anon
                baseline = rss_anon(None, threads)
            for key, m in models.items():
                path = Path(tmp) / f"{key}.fgm"
                m.save(path)
                prec = m.report.precision or {}
                sides[key] = PrecisionSide(
                    precision=m.config.precision, latency_ms=statistics.median(samples[key]),
                    p90_ms=_p90(samples[key]), compile_s=compile_s[key], kernels=m.report.kernel_count,
                    arena_bytes=memory_of(m)[0], artifact_bytes=path.stat().st_size,
                    by_dtype=dict(prec.get("by_dtype") or {}), casts=int(prec.get("casts") or 0),
                    rss_anon_bytes=rss_anon(path, threads) if rss else None)
        return PrecisionComparison(
            model=str(model_src) if isinstance(model_src, (str, Path)) else fp32.name, precision=precision, reference=ref_name, inputs=inputs, runs=runs,
            threads=threads, fp32=sides["fp32"], reduced=sides["reduced"], accuracy=accuracy,
            kept_fp32=list(reduced_prec.get("kept_fp32") or []),
            fp32_logits=list(reduced_prec.get("fp32_logits") or []),
            declined=(reduced_prec.get("auto") or {}).get("declined"), calibration=how,
            baseline_rss_bytes=baseline)
    finally:
        ref_close()
        for m in models.values():
            m.close()


def _sci(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def render_precision(result: PrecisionComparison, title: str):
    """Two rich tables (performance, accuracy) as one renderable, and what auto declined."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    a, b, p = result.fp32, result.reduced, result.precision
    perf = Table(title=title)
    perf.add_column("metric")
    perf.add_column("fp32", justify="right")
    perf.add_column(p, justify="right")
    perf.add_column("gain", justify="right")

    def row(name, x, y, fmt):
        gain = "-" if not x or not y else f"{x / y:.2f}x"
        perf.add_row(name, fmt(x), fmt(y), gain)

    row("latency median", a.latency_ms, b.latency_ms, lambda v: f"{v:.2f} ms")
    row("latency p90", a.p90_ms, b.p90_ms, lambda v: f"{v:.2f} ms")
    row("activation arena (planned)", a.arena_bytes, b.arena_bytes, megabytes)
    row("artifact (.fgm) size", a.artifact_bytes, b.artifact_bytes, megabytes)
    if a.rss_anon_bytes is not None and b.rss_anon_bytes is not None:
        row("RssAnon, loaded + 1 run (own process)", a.rss_anon_bytes, b.rss_anon_bytes, megabytes)
        perf.add_row("  of which the process without a model", megabytes(result.baseline_rss_bytes),
                     megabytes(result.baseline_rss_bytes), "")
    perf.add_row("nodes by dtype", ", ".join(f"{k} {v}" for k, v in a.by_dtype.items()) or "all fp32",
                 ", ".join(f"{k} {v}" for k, v in b.by_dtype.items()) or "-", "")
    perf.add_row("precision casts", str(a.casts), str(b.casts), "")
    perf.add_row("kernels per run", str(a.kernels), str(b.kernels), "")

    acc = Table(title=f"accuracy against {result.reference}, {result.inputs} random input(s)")
    acc.add_column("output")
    acc.add_column("metric")
    acc.add_column("fp32 vs ref", justify="right")
    acc.add_column(f"{p} vs ref", justify="right")
    acc.add_column(f"{p} vs fp32", justify="right")
    metrics = [("rel L2 error (worst)", "rel_l2", _sci), ("max abs error", "max_abs", _sci),
               ("cosine (mean)", "cosine", lambda v: "-" if v is None else f"{v:.6f}"),
               ("top-1 agreement", "top1_agree", lambda v: "-" if v is None else f"{100 * v:.1f}%")]
    for name, sides in result.accuracy.items():
        for i, (label, key, fmt) in enumerate(metrics):
            vals = [sides.get(s, {}).get(key) for s in ("fp32", "reduced", "reduced_vs_fp32")]
            if all(v is None for v in vals):
                continue
            acc.add_row(Text(printable(name)) if i == 0 else "", label, *(fmt(v) for v in vals))
    parts = [perf, acc]
    if result.calibration:
        parts.append(Text(f"{p} calibration: {printable(result.calibration)}"))
    if result.declined:
        parts.append(Text(f"auto chose fp32: {printable(result.declined)}"))
    for title, rows in ((f"heavy ops kept in fp32 ({len(result.kept_fp32)})", result.kept_fp32),
                        (f"logits written in fp32 from {result.precision} operands ({len(result.fp32_logits)})",
                         result.fp32_logits)):
        if rows:
            kept = Table(title=title)
            kept.add_column("node")
            kept.add_column("op")
            kept.add_column("why")
            for k in rows[:20]:
                kept.add_row(*(Text(printable(k[key])) for key in ("node", "op", "why")))
            parts.append(kept)
    return Group(*parts)
