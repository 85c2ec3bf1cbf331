"""The subcommands that explain a model (a thin face over ``fusegraph.tools``):

    fusegraph profile MODEL [--runs N] [--trace out.json] [--streams N] [--threads N]
    fusegraph bisect MODEL [--reference onnxruntime|O0] [--rtol R] [--atol A]   (exit 1: divergence found)
    fusegraph bisect MODEL --precision bf16|fp16 [--top N]   (the ops whose reduced precision costs most)
    fusegraph bisect MODEL --precision int8 [--calibration DIR] [--top N]   (the products whose quantisation costs most)
    fusegraph inspect MODEL --html report.html      (adds --html to ``inspect``)

``add_report_parsers(sub)`` is what ``main.build_parser`` calls; it owns no logic of its own.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UsageError
from .common import (config_from_args, load_model, positive_int, random_feeds, read_calibration_dir, stream_count,
                     threads_arg)


class _Stages:
    """A rich spinner on stderr naming the compile stage (only when stderr is a terminal)."""

    def __init__(self, what: str):
        self.what, self._status = what, None

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            self._status = Console(stderr=True).status(f"{self.what}: compiling")
            self._status.__enter__()
        return self

    def stage(self, name: str) -> None:
        if self._status is not None:
            self._status.update(f"{self.what}: {name}")

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


def _compile_for(args, **extra):
    import fusegraph as fg

    if Path(args.model).suffix == ".fgm":
        given = [f"--{k}" for k, v in extra.items() if v is not None]
        if given:
            raise UsageError(f"{args.model}: {' and '.join(given)} applies when compiling a model; an .fgm "
                             f"artifact is already compiled (recompile the .onnx model instead)")
        return load_model(args.model, args)
    config = config_from_args(args).replace(**{k: v for k, v in extra.items() if v is not None})
    with _Stages(args.model) as status:
        return fg.compile(args.model, config=config, on_stage=status.stage)


def cmd_profile(args) -> int:
    from ..tools.profile import profile
    model = _compile_for(args, streams=args.streams)
    try:
        prof = profile(model, random_feeds(model), runs=args.runs)
    finally:
        model.close()
    print(prof.to_text(top=args.top))
    if args.trace:
        Path(args.trace).write_text(json.dumps(prof.to_chrome_trace()))
        print(f"trace written to {args.trace} (open in chrome://tracing or ui.perfetto.dev)")
    return 0


def cmd_bisect(args) -> int:
    from ..tools.bisect import bisect
    if Path(args.model).suffix == ".fgm":
        raise UsageError(f"{args.model}: bisect re-runs the passes on the source model; give the .onnx file")
    if args.precision is not None:
        return _bisect_precision(args)
    given = [f for f, v in (("--top", args.top), ("--calibration", args.calibration)) if v is not None]
    if given:
        raise UsageError(f"bisect {' and '.join(given)} applies to a precision bisect: give --precision bf16 "
                         f"(fp16, or int8)")
    reference = args.reference or "O0"
    if reference == "onnxruntime" and Path(args.model).suffix != ".onnx":
        raise UsageError(f"{args.model}: --reference onnxruntime runs the .onnx model; give an .onnx file")
    result = bisect(args.model, reference=reference, rtol=1e-3 if args.rtol is None else args.rtol,
                    atol=1e-4 if args.atol is None else args.atol, progress=sys.stderr.isatty())
    print(result.to_text())
    return 0 if result.found is None else 1


def _bisect_precision(args) -> int:
    """``bisect --precision P``: the reduced ops ranked by the accuracy each costs alone (exit 0)."""
    from rich.console import Console

    from ..tools.precision_bisect import precision_bisect
    given = [f for f, v in (("--reference", args.reference), ("--rtol", args.rtol), ("--atol", args.atol))
             if v is not None]
    if given:
        raise UsageError(f"bisect {' and '.join(given)} applies to the pass bisect; --precision compares "
                         f"against the float32 model and ranks ops by relative L2 error")
    if args.calibration is not None and args.precision != "int8":
        raise UsageError(f"bisect --calibration applies to --precision int8 (the activations' ranges); "
                         f"{args.precision} uses none")
    calibration = read_calibration_dir(args.calibration) if args.calibration else None
    result = precision_bisect(args.model, precision=args.precision, top=args.top or 10,
                              progress=sys.stderr.isatty(), calibration=calibration)
    Console().print(result.render())
    return 0


def cmd_inspect_html(args, fallback) -> int:
    """``inspect --html``: the page, then whatever else ``inspect`` was asked to print (same model)."""
    if not args.html:
        return fallback(args)
    from ..tools.html.page import write_html
    model = _compile_for(args)
    try:
        source = args.model if Path(args.model).suffix != ".fgm" else None
        info = write_html(model, args.html, feeds=random_feeds(model), source=source)
        print(f"report written to {args.html} ({info['bytes'] / 1024:.0f} KiB, {info['nodes']} nodes, "
              f"{model.report.kernel_count} kernels)")
        return fallback(args, model=model)
    finally:
        model.close()


def add_report_parsers(sub) -> None:
    """Add ``profile`` and ``bisect``, and ``--html`` to ``inspect``."""

    p = sub.add_parser("profile", help="per-kernel times of the generated run; Chrome/Perfetto trace")
    p.add_argument("model", help="an .onnx model or .fgm artifact")
    p.add_argument("--runs", type=positive_int, default=10, help="timed runs (default 10)")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome / Perfetto trace (chrome://tracing)")
    p.add_argument("--streams", type=stream_count, metavar="N|auto", help="stream count to compile with")
    p.add_argument("--threads", type=threads_arg, help="intra-op threads (1 .. the machine's cores)")
    p.add_argument("--top", type=positive_int, default=15, help="rows of the top-kernels table (default 15)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("bisect", help="the first pass and rule application after which outputs diverge; "
                                      "with --precision, the ops whose reduced precision costs the most accuracy")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("--reference", choices=["O0", "onnxruntime"],
                   help="what outputs are compared against (default O0: the unoptimised graph)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default 1e-3)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default 1e-4)")
    p.add_argument("--precision", choices=["bf16", "fp16", "int8"],
                   help="rank the ops this precision reduces by the outputs' error when only that op is "
                        "rounded (int8: only that product quantised) instead of the pass bisect")
    p.add_argument("--calibration", metavar="DIR",
                   help="with --precision int8: a directory of .npz files, one input set each, to calibrate on "
                        "(default: random inputs for a model with convolutions, else dynamic quantisation)")
    p.add_argument("--top", type=positive_int, help="rows of the --precision ranking (default 10)")
    p.set_defaults(func=cmd_bisect)

    inspect = sub.choices["inspect"]
    inspect.add_argument("--html", metavar="REPORT.html",
                         help="write a self-contained HTML report (graph, fusions, passes, memory, streams, profile)")
    fallback = inspect.get_default("func")
    inspect.set_defaults(func=lambda args: cmd_inspect_html(args, fallback))

