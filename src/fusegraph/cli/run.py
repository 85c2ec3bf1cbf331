"""``fusegraph run`` and ``fusegraph inspect``: run a model once; print what it compiled to (the
IR, the generated code, the fusions, the stream plan it runs, the memory plan). Only
presentation lives here; the work is the public API.

    fusegraph run MODEL [--input NAME=FILE.npy ...] [-o DIR]
    fusegraph inspect MODEL [--code] [--fusions] [--streams [--num-streams N]] [--memory MODE] [--memory-plot OUT.png]
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..config import MEMORY_MODES
from ..errors import UsageError
from ..report.printable import printable
from ..report.summary import declines_text
from .common import load_model, model_flags, parse_inputs, precision_line, random_feeds, stream_count


def cmd_run(args) -> int:
    model = load_model(args.model, args)
    feeds = parse_inputs(args.input)
    if not feeds:
        feeds = random_feeds(model)
    t0 = time.perf_counter()
    outputs = model.run(feeds)
    elapsed = time.perf_counter() - t0
    out_dir = Path(args.output) if args.output else None
    if out_dir:
        if out_dir.exists() and not out_dir.is_dir():
            raise UsageError(f"-o {args.output}: exists and is not a directory (outputs are written as "
                             f"NAME.npy files into a directory)")
        out_dir.mkdir(parents=True, exist_ok=True)
    for name, value in outputs.items():
        checksum = float(np.asarray(value, dtype=np.float64).sum()) if value.dtype != object else 0.0
        print(f"{printable(name)}: shape={list(value.shape)} dtype={value.dtype} sum={checksum:.6g}")
        if out_dir:
            np.save(out_dir / f"{name.replace('/', '_')}.npy", value)
    print(f"time: {elapsed * 1000:.2f} ms ({how_it_runs(model)})")
    return 0


def how_it_runs(model) -> str:
    """Level, kernels and threads a model runs with (what --level / --threads changed)."""
    import torch
    threads = model.config.threads or torch.get_num_threads()
    prec = model.config.precision
    prec = "" if prec == "fp32" and not model.config.op_precision else f", {prec} precision"
    return f"{model.config.level}{prec}, {model.report.kernel_count} kernels per run, {threads} thread(s)"


def memory_summary(model, plot: str | None) -> None:
    mem = model.report.memory
    if mem is None:
        return
    print(mem.summary())
    slow = mem.not_writable_into_arena
    if slow:
        print(f"not writable into the arena: {len(slow)} nodes, "
              f"{sum(d['bytes'] for d in slow) / (1 << 20):.2f} MiB allocated by their kernels per run")
    if plot:
        from ..tools.memory_plot import plot_memory_timeline
        plot_memory_timeline(mem, plot, title=None)
        print(f"memory timeline written to {plot}")


def need_matplotlib(plot: str | None) -> None:
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--memory-plot draws with matplotlib, which is not installed: "
                             "pip install 'fusegraph[plot]'") from None


def kernels_summary(report) -> None:
    kernels = report.kernels
    if kernels and kernels["implementations"]:
        top = ", ".join(f"{n} {printable(k)}" for k, n in sorted(kernels["implementations"].items(),
                                                               key=lambda kv: -kv[1])[:6])
        print(f"kernels ({printable(kernels['backend'])} backend): {top}")
    if kernels and kernels["declined"]:
        print(f"  {declines_text(kernels['declined'])}")


def cmd_inspect(args, model=None) -> int:
    """Each of --code, --fusions, --streams prints its section (in that order, any together);
    with none of them, the IR summary. --memory-plot draws the timeline in every case.
    ``model``: already compiled or loaded from ``args`` (``inspect --html``)."""
    need_matplotlib(args.memory_plot)
    model = model if model is not None else load_model(args.model, args)
    streams = args.streams or args.num_streams is not None
    if args.code:
        print(model.source)
    if args.fusions:
        from ..tools.fusion_text import fusion_text
        print(fusion_text(model.report.fusions))
    if streams:
        plan = model.report.streams         # what the stream planner decided for this model
        print(plan.to_text() if plan is not None else
              "streams: 1 (compiled for one stream; --num-streams N compiles it for N)")
    if args.code or args.fusions or streams:
        if args.memory_plot:
            memory_summary(model, args.memory_plot)
        return 0
    print(model.graph)
    print()
    print(f"nodes: {model.report.nodes_imported} imported, {model.report.nodes_final} after passes; "
          f"kernels per run: {model.report.kernel_count}"
          + (f" (+{model.report.shape_kernels} once per input shapes)" if model.report.shape_kernels else ""))
    print(f"runs as: {how_it_runs(model)}")
    kernels_summary(model.report)
    line = precision_line(model.report)
    if line:
        print(line)
    print("op histogram:")
    for op, count in model.report.op_histogram.items():
        print(f"  {printable(op):<28} {count}")
    memory_summary(model, getattr(args, "memory_plot", None))
    return 0


def add_run_parsers(sub) -> None:
    """Add ``run`` and ``inspect``."""
    p = sub.add_parser("run", help="run a model once on given or random inputs")
    model_flags(p)
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input (repeatable)")
    p.add_argument("-o", "--output", metavar="DIR", help="save outputs as .npy files here")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("inspect", help="print the compiled IR and an op histogram")
    model_flags(p)
    p.add_argument("--code", action="store_true", help="print the generated run function")
    p.add_argument("--streams", action="store_true", help="print the stream plan the model runs")
    p.add_argument("--fusions", action="store_true", help="list the fusions applied and declined, with reasons")
    p.add_argument("--num-streams", type=stream_count, metavar="N|auto",
                   help="compile with this stream count (implies --streams)")
    p.add_argument("--memory", choices=MEMORY_MODES, help="memory mode (default balanced)")
    p.add_argument("--memory-plot", metavar="OUT.png", help="draw the memory plan's timeline (matplotlib)")
    p.set_defaults(func=cmd_inspect)
