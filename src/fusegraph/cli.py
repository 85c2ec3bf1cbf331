"""The ``fusegraph`` command: a thin face over the public API (no logic the API lacks).

    fusegraph run MODEL [--input NAME=FILE.npy ...] [-o DIR]
    fusegraph inspect MODEL [--code] [--fusions] [--memory MODE] [--memory-plot OUT.png]
    fusegraph demo
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .errors import FusegraphError, InputError, UsageError


def _random_feeds(model, seed: int = 0) -> dict[str, np.ndarray]:
    from .runtime.feeds import random_feeds
    return random_feeds(model.inputs, seed)


def _parse_inputs(items: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--input {name}: cannot read {path!r} as a .npy file: {exc}") from None
    return feeds


_COMPILE_FLAGS = ("level", "memory")   # options that only mean something when compiling


def _load(path: str, args):
    """An .fgm artifact loads without compiling (compile options are refused for it, not
    ignored); anything else is compiled."""
    import fusegraph as fg
    if Path(path).suffix == ".fgm":
        given = [f"--{k}" for k in _COMPILE_FLAGS if getattr(args, k, None) is not None]
        if given:
            raise UsageError(f"{path}: {' and '.join(given)} applies when compiling a model; an .fgm "
                             f"artifact is already compiled (recompile the .onnx model instead)")
        return fg.load(path, threads=getattr(args, "threads", None))
    from .frontends.python_model import resolve_model_arg
    source, inputs = resolve_model_arg(path)     # file.py:factory builds a torch model
    return fg.compile(source, config=_config(args), example_inputs=inputs)


def _config(args):
    import fusegraph as fg
    kwargs = {k: getattr(args, k) for k in ("level", "threads", "memory") if getattr(args, k, None) is not None}
    return fg.Config(**kwargs)


def _threads_arg(text: str) -> int:
    from .runtime.threads import machine_cores
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= machine_cores():
        raise argparse.ArgumentTypeError(f"expected an integer 1..{machine_cores()} (this machine's cores), "
                                         f"got {text!r}")
    return n


def _positive_int(text: str, what: str = "a positive integer") -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return n


def cmd_run(args) -> int:
    model = _load(args.model, args)
    feeds = _parse_inputs(args.input)
    if not feeds:
        feeds = _random_feeds(model)
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
        print(f"{name}: shape={list(value.shape)} dtype={value.dtype} sum={checksum:.6g}")
        if out_dir:
            np.save(out_dir / f"{name.replace('/', '_')}.npy", value)
    print(f"time: {elapsed * 1000:.2f} ms ({_how(model)})")
    return 0


def _how(model) -> str:
    """Level, kernels and threads a model runs with (what --level / --threads changed)."""
    import torch
    threads = model.config.threads or torch.get_num_threads()
    return f"{model.config.level}, {model.report.kernel_count} kernels per run, {threads} thread(s)"


def _memory_summary(model, plot: str | None) -> None:
    mem = model.report.memory
    if mem is None or not hasattr(mem, "summary"):
        return
    print(mem.summary())
    slow = mem.not_writable_into_arena
    if slow:
        print(f"not writable into the arena: {len(slow)} nodes, "
              f"{sum(d['bytes'] for d in slow) / (1 << 20):.2f} MiB allocated by their kernels per run")
    if plot:
        from .plan.memory_report import plot_memory_timeline
        plot_memory_timeline(mem, plot, title=None)
        print(f"memory timeline written to {plot}")


def _need_matplotlib(plot: str | None) -> None:
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--memory-plot draws with matplotlib, which is not installed: "
                             "pip install 'fusegraph[plot]'") from None


def _segments_summary(report) -> None:
    segs = report.segments
    if segs:
        parts = [s["partitions"] for s in segs]
        counted = f"{sum(parts)} oneDNN Graph partitions" if None not in parts else "compiled at their first call"
        print(f"script segments: {len(segs)} ({sum(s['nodes'] for s in segs)} nodes, {counted}); "
              f"Python calls per run: {report.python_calls}")
    kernels = getattr(report, "kernels", None) or {}
    if kernels.get("declined"):
        first = kernels["declined"][0]
        print(f"backend {kernels.get('backend')}: {len(kernels['declined'])} node(s) on the op's portable kernel "
              f"(first: {first['node']} ({first['op']}): {first['reason']})")
    for d in report.segments_dropped[:5]:     # a dropped run was retried in halves
        print(f"  segment of {d['nodes']} nodes from {d['first']} not used: {d['reason'].splitlines()[0]}")
    if len(report.segments_dropped) > 5:
        print(f"  ... and {len(report.segments_dropped) - 5} more (model.report.segments_dropped)")


def cmd_inspect(args, model=None) -> int:
    """Each of --code, --fusions, --streams prints its section (in that order, any together);
    with none of them, the IR summary. --memory-plot draws the timeline in every case.
    ``model``: already compiled or loaded from ``args`` (``inspect --html``)."""
    _need_matplotlib(args.memory_plot)
    model = model if model is not None else _load(args.model, args)
    streams = args.streams or args.num_streams is not None
    if args.code:
        print(model.source)
    if args.fusions:
        from .report.fusion_text import fusion_text
        print(fusion_text(model.report.fusions))
    if streams:
        from .plan.streams import plan_streams
        print(plan_streams(model.graph, model.graph.nodes, args.num_streams or "auto").to_text())
    if args.code or args.fusions or streams:
        if args.memory_plot:
            _memory_summary(model, args.memory_plot)
        return 0
    print(model.graph)
    print()
    print(f"nodes: {model.report.nodes_imported} imported, {model.report.nodes_final} after passes; "
          f"kernels per run: {model.report.kernel_count}"
          + (f" (+{model.report.shape_kernels} once per input shapes)" if model.report.shape_kernels else ""))
    print(f"runs as: {_how(model)}")
    _segments_summary(model.report)
    print("op histogram:")
    for op, count in model.report.op_histogram.items():
        print(f"  {op:<28} {count}")
    _memory_summary(model, getattr(args, "memory_plot", None))
    return 0


def _stream_count(text: str):
    return text if text == "auto" else _positive_int(text, "a positive integer or 'auto'")


def cmd_compile(args) -> int:
    from .cli_compile import compile_command
    return compile_command(args)


def cmd_bench(args) -> int:
    import json

    from .bench import bench
    if Path(args.model).suffix == ".fgm" and args.vs:
        raise UsageError(f"{args.model}: --vs {' --vs '.join(args.vs)} runs the peer on the .onnx model; "
                         f"give the .onnx file (an .fgm artifact is fusegraph's own)")
    result = bench(args.model, vs=tuple(args.vs or ()), threads=args.threads, runs=args.runs)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"{result.model}: {result.threads} threads, median of {result.runs} runs, {result.kernels} kernels")
    print(f"  fusegraph   {result.fusegraph_ms:9.2f} ms")
    for peer, ms in result.peers_ms.items():
        print(f"  {peer:<11} {ms:9.2f} ms   ratio fusegraph/{peer} = {result.ratio(peer):.3f}")
    return 0


def cmd_compare(args) -> int:
    from rich.console import Console

    from .compare import compare, render
    level = args.level or "O2"
    if level == "O0":
        raise UsageError("compare --level sets the optimised side (O1 or O2); the other side is always O0")
    config = _config(args).replace(level=level)
    columns = compare(args.model, runs=args.runs, config=config)
    import torch
    Console().print(render(columns, f"{args.model}: unoptimised (O0) vs optimised ({level}), "
                                    f"{config.threads or torch.get_num_threads()} thread(s), "
                                    f"median of {args.runs} runs"))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fusegraph", description="graph engine for deep-learning inference")
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("model", help="an .onnx model or .fgm artifact")
        p.add_argument("--level", choices=["O0", "O1", "O2"], help="pass pipeline (default O2)")
        p.add_argument("--threads", type=_threads_arg, help="intra-op threads (1 .. the machine's cores)")

    p = sub.add_parser("run", help="run a model once on given or random inputs")
    common(p)
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input (repeatable)")
    p.add_argument("-o", "--output", metavar="DIR", help="save outputs as .npy files here")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("inspect", help="print the compiled IR and an op histogram")
    common(p)
    p.add_argument("--code", action="store_true", help="print the generated run function")
    p.add_argument("--streams", action="store_true", help="print the stream assignment and events")
    p.add_argument("--fusions", action="store_true", help="list the fusions applied and declined, with reasons")
    p.add_argument("--num-streams", type=_stream_count, metavar="N|auto",
                   help="stream count for --streams (implies --streams; default auto)")
    p.add_argument("--memory", choices=["off", "balanced", "tight"], help="memory mode (default balanced)")
    p.add_argument("--memory-plot", metavar="OUT.png", help="draw the memory plan's timeline (matplotlib)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("compile", help="compile a model into an .fgm artifact")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("-o", "--output", required=True, metavar="OUT.fgm")
    p.add_argument("--config", metavar="cfg.toml", help="a TOML file mapping onto fg.Config")
    p.add_argument("--level", choices=["O0", "O1", "O2"])
    p.add_argument("--streams", type=_stream_count, metavar="N|auto")
    p.add_argument("--memory", choices=["off", "balanced", "tight"])
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], help="fp32 (fp16 / bf16: not yet)")
    p.add_argument("--threads", type=_threads_arg)
    p.add_argument("--disable", action="append", metavar="PASS", help="disable a pass (repeatable)")
    p.add_argument("--example-input", action="append", metavar="1x3x224x224[:int64]",
                   help="for MODEL given as file.py:factory (a torch model): an input's shape (repeatable)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("bench", help="latency beside onnxruntime / PyTorch eager, same process")
    p.add_argument("model", help="an .onnx model or .fgm artifact")
    p.add_argument("--vs", action="append", choices=["onnxruntime", "torch"], help="peer (repeatable)")
    p.add_argument("--threads", type=_threads_arg, default=min(2, _cores()))
    p.add_argument("--runs", type=_positive_int, default=30, help="timed runs per engine (at least 30 advised)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("compare", help="unoptimised vs optimised: latency, memory, throughput, load time")
    common(p)
    p.add_argument("--runs", type=_positive_int, default=20)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="the main job on a bundled model, with a before/after table")
    p.set_defaults(func=cmd_demo)

    from .cli_serve import add_serve_parser
    add_serve_parser(sub)
    from .cli_report import add_report_parsers   # profile, bisect, inspect --html
    add_report_parsers(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FusegraphError as exc:
        print(f"fusegraph: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:   # a path the command was given cannot be read or written
        where = f" {exc.filename}" if exc.filename else ""
        print(f"fusegraph: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _cores() -> int:
    from .runtime.threads import machine_cores
    return machine_cores()


if __name__ == "__main__":
    sys.exit(main())
