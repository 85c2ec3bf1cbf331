"""``fusegraph bench``, ``fusegraph compare`` and ``fusegraph demo``: a model's latency beside
its peers, unoptimised against optimised (or fp32 against reduced precision), and the main job
on a bundled model. Only presentation lives here; the work is in ``fusegraph.tools``.

    fusegraph bench MODEL [--vs onnxruntime] [--vs torch] [--threads N] [--json]
    fusegraph compare MODEL [--precision bf16 [--op-precision NODE_OR_OP=PREC ...] [--inputs N]] [--runs R]
    fusegraph compare MODEL --precision int8 [--inputs N] [--calibration DIR [--calibration-method M]]
    fusegraph demo
"""
from __future__ import annotations

from pathlib import Path

from ..config import machine_cores
from ..errors import UsageError
from ..report.printable import printable
from ..config import CALIBRATIONS
from .common import (config_from_args, dim_arg, model_flags, positive_int, precision_flags, read_calibration_dir,
                     threads_arg)


def cmd_bench(args) -> int:
    import json

    from ..tools.bench import bench
    if args.decode is not None:
        return _bench_decode(args)
    if args.prompt is not None:
        raise UsageError("bench --prompt sets the prompt of --decode N (a greedy decode loop)")
    if Path(args.model).suffix == ".fgm" and args.vs:
        raise UsageError(f"{args.model}: --vs {' --vs '.join(args.vs)} runs the peer on the .onnx model; "
                         f"give the .onnx file (an .fgm artifact is fusegraph's own)")
    config = None
    if args.precision is not None or args.op_precision:
        if Path(args.model).suffix == ".fgm":
            raise UsageError(f"{args.model}: --precision and --op-precision apply when compiling a model; an "
                             f".fgm artifact is already compiled (recompile the .onnx model instead)")
        config = config_from_args(args)
    result = bench(args.model, vs=tuple(args.vs or ()), threads=args.threads, runs=args.runs, config=config,
                   dims=dict(args.dim or ()))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    prec = f", {config.precision} precision" if config is not None else ""
    print(f"{printable(result.model)}: {result.threads} threads{prec}, median of {result.runs} runs, {result.kernels} kernels")
    print("  inputs " + ", ".join(f"{printable(k)} {v}" for k, v in result.shapes.items()))
    print(f"  fusegraph   {result.fusegraph_ms:9.2f} ms")
    for peer, ms in result.peers_ms.items():
        print(f"  {peer:<11} {ms:9.2f} ms   ratio fusegraph/{peer} = {result.ratio(peer):.3f}")
    return 0


def _bench_decode(args) -> int:
    """``bench --decode N``: a greedy decode loop, milliseconds per token (``tools/decode.py``)."""
    import json

    from ..tools.decode import decode
    given = [f for f, v in (("--precision", args.precision), ("--op-precision", args.op_precision),
                            ("--dim", args.dim)) if v]
    if given:
        raise UsageError(f"bench --decode runs the decoder as compiled by default; {' and '.join(given)} "
                         f"do not apply to it")
    result = decode(args.model, prompt=args.prompt or 32, tokens=args.decode, threads=args.threads,
                    vs=tuple(args.vs or ()))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"{printable(result.model)}: {result.threads} threads, prompt {result.prompt}, {result.tokens} greedy "
          f"tokens{'' if result.same_tokens else ' (ENGINES CHOSE DIFFERENT TOKENS)'}")
    print(f"  {'engine':<20} {'prompt ms':>10} {'ms/token':>9} {'p90':>8} {'total ms':>9}")
    for name, e in result.engines.items():
        print(f"  {name:<20} {e['prompt_ms']:10.2f} {e['token_ms']:9.2f} {e['p90_ms']:8.2f} {e['total_ms']:9.1f}")
    return 0 if result.same_tokens else 1


def cmd_compare(args) -> int:
    from rich.console import Console

    from ..tools.compare import compare, render
    if Path(args.model).suffix == ".fgm":
        raise UsageError(f"{args.model}: compare compiles the model twice; give the .onnx model, not an "
                         f".fgm artifact")
    if args.precision is not None:
        return _compare_precision(args)
    given = [f for f, v in (("--op-precision", args.op_precision), ("--inputs", args.inputs),
                            ("--calibration", args.calibration), ("--calibration-method", args.calibration_method))
             if v]
    if given:
        raise UsageError(f"compare {' and '.join(given)} applies to the reduced side of --precision "
                         f"(e.g. compare MODEL --precision bf16 {given[0]} ...)")
    level = args.level or "O2"
    if level == "O0":
        raise UsageError("compare --level sets the optimised side (O1 or O2); the other side is always O0")
    config = config_from_args(args).replace(level=level)
    columns = compare(args.model, runs=args.runs, config=config)
    import torch
    Console().print(render(columns, f"{args.model}: unoptimised (O0) vs optimised ({level}), "
                                    f"{config.threads or torch.get_num_threads()} thread(s), "
                                    f"median of {args.runs} runs"))
    return 0


def _compare_precision(args) -> int:
    """``compare --precision P``: fp32 beside P, same config otherwise (``--level``: both sides)."""
    from rich.console import Console

    from ..tools.compare_precision import compare_precision, render_precision
    reduced = config_from_args(args)     # checks --precision / --op-precision (a ConfigError for a bad value)
    if reduced.precision == "fp32":
        raise UsageError("compare --precision sets the reduced side (bf16, fp16, int8 or auto); the other side is "
                         "always fp32")
    if args.calibration and reduced.precision not in ("int8", "auto"):
        raise UsageError(f"compare --calibration applies to --precision int8 or auto; {reduced.precision} uses none")
    calibration = read_calibration_dir(args.calibration) if args.calibration else None
    base = reduced.replace(precision="fp32", op_precision=(), calibration="minmax", calibration_percentile=99.999)
    inputs = args.inputs or 8
    result = compare_precision(args.model, precision=reduced.precision, inputs=inputs, runs=args.runs,
                               config=base, op_precision=reduced.op_precision, calibration=calibration,
                               calibration_method=reduced.calibration, rss=True)
    Console().print(render_precision(result, f"{args.model}: fp32 vs {result.precision} ({base.level}), "
                                             f"{result.threads} thread(s), median of {args.runs} runs"))
    return 0


def cmd_demo(args) -> int:
    from ..tools.demo import run_demo
    return run_demo(threads=args.threads)


def add_measure_parsers(sub) -> None:
    """Add ``bench``, ``compare`` and ``demo``."""
    p = sub.add_parser("bench", help="latency beside onnxruntime / PyTorch eager, same process")
    p.add_argument("model", help="an .onnx model or .fgm artifact")
    p.add_argument("--vs", action="append", choices=["onnxruntime", "torch"], help="peer (repeatable)")
    p.add_argument("--threads", type=threads_arg, default=min(2, machine_cores()))
    p.add_argument("--runs", type=positive_int, default=30, help="timed runs per engine (at least 30 advised)")
    p.add_argument("--dim", action="append", type=dim_arg, metavar="NAME=SIZE",
                   help="size of a symbolic input dim, e.g. seq=128 (repeatable; others: batch 1, else 1)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--decode", type=positive_int, metavar="N",
                   help="a decoder with its KV cache as inputs / outputs: N greedy tokens, ms per token "
                        "(the cache kept inside fusegraph, plain runs, and --vs onnxruntime)")
    p.add_argument("--prompt", type=positive_int, metavar="P", help="with --decode: prompt tokens (default 32)")
    precision_flags(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("compare", help="unoptimised vs optimised: latency, memory, throughput, load time; "
                                       "with --precision: fp32 vs reduced precision, with accuracy")
    model_flags(p)
    p.add_argument("--runs", type=positive_int, default=20)
    p.add_argument("--inputs", type=positive_int, metavar="N",
                   help="with --precision: random inputs the accuracy figures are over (default 8)")
    p.add_argument("--calibration", metavar="DIR",
                   help="with --precision int8 or auto: a directory of .npz files, one input set each, to "
                        "calibrate on (int8 default: random inputs for a model with convolutions, else dynamic)")
    p.add_argument("--calibration-method", choices=CALIBRATIONS,
                   help="with --precision int8: how activation ranges are chosen (default minmax)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="the main job on a bundled model, with a before/after table")
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="intra-op threads of both compiles (default: Config's, fewer where other processes "
                        "keep cores busy)")
    p.set_defaults(func=cmd_demo)
