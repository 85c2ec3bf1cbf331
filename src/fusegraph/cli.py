"""The ``fusegraph`` command: a thin face over the public API (no logic the API lacks).

    fusegraph run MODEL [--input NAME=FILE.npy ...] [-o DIR]
    fusegraph inspect MODEL [--code] [--fusions] [--memory MODE] [--memory-plot OUT.png]
    fusegraph compare MODEL [--precision bf16 [--op-precision NODE_OR_OP=PREC ...] [--inputs N]] [--runs R]
    (run / inspect / compile / bench / compare take --precision and --op-precision)
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


_COMPILE_FLAGS = ("level", "memory", "precision", "op_precision")   # options that only mean something when compiling


def _load(path: str, args):
    """An .fgm artifact loads without compiling (compile options are refused for it, not
    ignored); anything else is compiled."""
    import fusegraph as fg
    if Path(path).suffix == ".fgm":
        given = [f"--{k.replace('_', '-')}" for k in _COMPILE_FLAGS if getattr(args, k, None)]
        if given:
            raise UsageError(f"{path}: {' and '.join(given)} applies when compiling a model; an .fgm "
                             f"artifact is already compiled (recompile the .onnx model instead)")
        return fg.load(path, threads=getattr(args, "threads", None))
    from .frontends.python_model import resolve_model_arg
    source, inputs = resolve_model_arg(path)     # file.py:factory builds a torch model
    return fg.compile(source, config=_config(args), example_inputs=inputs)


def _config(args):
    import fusegraph as fg
    kwargs = {k: getattr(args, k) for k in ("level", "threads", "memory", "precision")
              if getattr(args, k, None) is not None}
    ops = op_precision_arg(getattr(args, "op_precision", None))
    if ops:
        kwargs["op_precision"] = ops
    return fg.Config(**kwargs)


def op_precision_arg(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--op-precision NAME=PREC`` items (repeatable; a later one for the same name wins) as
    ``Config.op_precision`` pairs; the values are checked by ``Config`` (a ConfigError)."""
    from .errors import ConfigError
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, prec = item.rpartition("=")
        if not sep or not name:
            raise ConfigError(f"--op-precision expects NODE_OR_OP=fp32|bf16|fp16 (e.g. Conv=bf16), got {item!r}")
        out[name] = prec
    return tuple(out.items())


def precision_line(report) -> str | None:
    """One line about ``report.precision`` (None for a plain fp32 compile)."""
    prec = getattr(report, "precision", None)
    if not prec:
        return None
    get = (lambda k: prec.get(k)) if isinstance(prec, dict) else (lambda k: getattr(prec, k, None))
    by_dtype = dict(get("by_dtype") or {})
    counts = ", ".join(f"{n} {d}" for d, n in sorted(by_dtype.items(), key=lambda kv: -kv[1])) or "no float nodes"
    kept = list(get("kept_fp32") or [])
    ops = dict(get("op_precision") or {})
    line = f"precision: {get('policy')} policy: nodes {counts}; {get('casts') or 0} cast(s)"
    if get("casts_folded"):
        line += f" ({get('casts_folded')} more folded into their producers)"
    if ops:
        line += "; op_precision " + ", ".join(f"{k}={v}" for k, v in ops.items())
    if kept:
        first = kept[0]
        line += (f"; {len(kept)} heavy op(s) kept in fp32 (first: {first['node']} ({first['op']}): "
                 f"{first['why']})")
    logits = list(get("fp32_logits") or [])
    if logits:
        line += (f"; {len(logits)} logits product(s) write fp32 from {get('policy')} operands "
                 f"(first: {logits[0]['node']} ({logits[0]['op']}))")
    unmatched = list(get("op_precision_unmatched") or [])
    if unmatched:
        line += f"; op_precision entries that changed nothing (no run-time node): {', '.join(unmatched)}"
    declined = (get("auto") or {}).get("declined")
    if declined:
        line += f"; auto chose fp32: {declined}"
    return line


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


def _dim_arg(text: str) -> tuple[str, int]:
    name, sep, size = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE (a symbolic dim and its size), got {text!r}")
    return name, _positive_int(size, f"a positive size for dim {name!r}")


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
    prec = model.config.precision
    prec = "" if prec == "fp32" and not model.config.op_precision else f", {prec} precision"
    return f"{model.config.level}{prec}, {model.report.kernel_count} kernels per run, {threads} thread(s)"


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


def _kernels_summary(report) -> None:
    kernels = getattr(report, "kernels", None) or {}
    impls = kernels.get("implementations") or {}
    if impls:
        top = ", ".join(f"{n} {k}" for k, n in sorted(impls.items(), key=lambda kv: -kv[1])[:6])
        print(f"kernels ({kernels.get('backend')} backend): {top}")
    if kernels.get("declined"):
        first = kernels["declined"][0]
        print(f"  {len(kernels['declined'])} node(s) declined to the op's portable kernel "
              f"(first: {first['node']} ({first['op']}): {first['reason']})")


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
    _kernels_summary(model.report)
    line = precision_line(model.report)
    if line:
        print(line)
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
    config = None
    if args.precision is not None or args.op_precision:
        if Path(args.model).suffix == ".fgm":
            raise UsageError(f"{args.model}: --precision and --op-precision apply when compiling a model; an "
                             f".fgm artifact is already compiled (recompile the .onnx model instead)")
        config = _config(args)
    result = bench(args.model, vs=tuple(args.vs or ()), threads=args.threads, runs=args.runs, config=config,
                   dims=dict(args.dim or ()))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    prec = f", {config.precision} precision" if config is not None else ""
    print(f"{result.model}: {result.threads} threads{prec}, median of {result.runs} runs, {result.kernels} kernels")
    print("  inputs " + ", ".join(f"{k} {v}" for k, v in result.shapes.items()))
    print(f"  fusegraph   {result.fusegraph_ms:9.2f} ms")
    for peer, ms in result.peers_ms.items():
        print(f"  {peer:<11} {ms:9.2f} ms   ratio fusegraph/{peer} = {result.ratio(peer):.3f}")
    return 0


def cmd_compare(args) -> int:
    from rich.console import Console

    from .compare import compare, render
    if Path(args.model).suffix == ".fgm":
        raise UsageError(f"{args.model}: compare compiles the model twice; give the .onnx model, not an "
                         f".fgm artifact")
    if args.precision is not None:
        return _compare_precision(args)
    given = [f for f, v in (("--op-precision", args.op_precision), ("--inputs", args.inputs)) if v]
    if given:
        raise UsageError(f"compare {' and '.join(given)} applies to the reduced side of --precision "
                         f"(e.g. compare MODEL --precision bf16 {given[0]} ...)")
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


def _compare_precision(args) -> int:
    """``compare --precision P``: fp32 beside P, same config otherwise (``--level``: both sides)."""
    from rich.console import Console

    from .compare_precision import compare_precision, render_precision
    reduced = _config(args)     # checks --precision / --op-precision (a ConfigError for a bad value)
    if reduced.precision == "fp32":
        raise UsageError("compare --precision sets the reduced side (bf16, fp16 or auto); the other side is "
                         "always fp32")
    base = reduced.replace(precision="fp32", op_precision=())
    inputs = args.inputs or 8
    result = compare_precision(args.model, precision=reduced.precision, inputs=inputs, runs=args.runs,
                               config=base, op_precision=reduced.op_precision)
    Console().print(render_precision(result, f"{args.model}: fp32 vs {result.precision} ({base.level}), "
                                             f"{result.threads} thread(s), median of {args.runs} runs"))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo()


def precision_flags(p) -> None:
    """``--precision`` and ``--op-precision`` (values checked by ``fg.Config``: a ConfigError)."""
    from .config import PRECISIONS
    p.add_argument("--precision", metavar="|".join(PRECISIONS),
                   help="mixed-precision policy (default fp32; compare: the reduced side)")
    p.add_argument("--op-precision", action="append", metavar="NODE_OR_OP=PREC",
                   help="per node name or op type: fp32 | bf16 | fp16, over the policy (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fusegraph", description="graph engine for deep-learning inference")
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("model", help="an .onnx model or .fgm artifact")
        p.add_argument("--level", choices=["O0", "O1", "O2"], help="pass pipeline (default O2)")
        p.add_argument("--threads", type=_threads_arg, help="intra-op threads (1 .. the machine's cores)")
        precision_flags(p)

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
    precision_flags(p)
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
    p.add_argument("--dim", action="append", type=_dim_arg, metavar="NAME=SIZE",
                   help="size of a symbolic input dim, e.g. seq=128 (repeatable; others: batch 1, else 1)")
    p.add_argument("--json", action="store_true")
    precision_flags(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("compare", help="unoptimised vs optimised: latency, memory, throughput, load time; "
                                       "with --precision: fp32 vs reduced precision, with accuracy")
    common(p)
    p.add_argument("--runs", type=_positive_int, default=20)
    p.add_argument("--inputs", type=_positive_int, metavar="N",
                   help="with --precision: random inputs the accuracy figures are over (default 8)")
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
