"""``fusegraph compile MODEL -o OUT.fgm``: compile with live progress (import -> passes ->
planning -> save), then a summary: nodes before and after, kernels, arena vs lower bound,
streams. Only presentation lives here; the work is ``fg.compile`` and ``model.save``."""
from __future__ import annotations

import time

from ..config import CALIBRATIONS, LEVELS, MEMORY_MODES
from .common import (config_from_args, precision_flags, precision_line, read_calibration_dir, stream_count,
                     threads_arg)


def _example_inputs(args):
    """``--example-input`` shapes as random tensors (for a ``file.py:factory`` torch model)."""
    given = getattr(args, "example_input", None)
    if not given:
        return None
    from ..errors import UsageError
    from ..frontends.python_model import is_python_spec, parse_example_input
    if not is_python_spec(args.model):
        raise UsageError(f"--example-input applies to a torch model given as file.py:factory, not to "
                         f"{args.model!r}")
    return tuple(parse_example_input(text, seed=i) for i, text in enumerate(given))


def compile_command(args) -> int:
    import fusegraph as fg
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console()
    config = config_from_args(args)
    calibration = read_calibration_dir(args.calibration) if args.calibration else None
    stages = ["import"] + (["calibration"] if calibration else []) + ["passes", "planning", "save"]
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        tasks = {s: progress.add_task(f"[dim]{s}", total=1, start=False) for s in stages}
        current = {"name": None}

        def on_stage(name: str) -> None:
            if current["name"] in tasks:
                progress.update(tasks[current["name"]], completed=1,
                                description=f"[green]{current['name']}")
            current["name"] = name
            if name in tasks:
                progress.start_task(tasks[name])
                progress.update(tasks[name], description=f"[bold]{name}")

        from ..frontends.python_model import resolve_model_arg
        source, inputs = resolve_model_arg(args.model, _example_inputs(args))
        model = fg.compile(source, config, on_stage=on_stage, example_inputs=inputs, calibration_inputs=calibration)
        on_stage("save")
        t0 = time.perf_counter()
        model.save(args.output)
        save_s = time.perf_counter() - t0
        on_stage("done")
    r = model.report
    mem = r.memory
    console.print(f"[bold]{args.output}[/bold] written ({save_s * 1000:.0f} ms)")
    console.print(f"  nodes: {r.nodes_imported} imported -> {r.nodes_final} after passes; "
                  f"kernels per run: {r.kernel_count}"
                  + (f" (+{r.shape_kernels} once per input shapes)" if r.shape_kernels else ""))
    if mem is not None and mem.lower_bound_bytes:
        console.print(f"  activation arena: {mem.arena_bytes / 1e6:.2f} MB (lower bound "
                      f"{mem.lower_bound_bytes / 1e6:.2f} MB, {mem.ratio_to_lower_bound:.3f}x)")
    if r.streams is not None:
        console.print(f"  streams: {r.streams.num_streams}")
    line = precision_line(r)
    if line:
        console.print(f"  {line}", markup=False, highlight=False)
    return 0


def add_compile_parser(sub) -> None:
    """Add ``compile``."""
    p = sub.add_parser("compile", help="compile a model into an .fgm artifact")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("-o", "--output", required=True, metavar="OUT.fgm")
    p.add_argument("--config", metavar="cfg.toml", help="a TOML file mapping onto fg.Config")
    p.add_argument("--level", choices=LEVELS)
    p.add_argument("--streams", type=stream_count, metavar="N|auto")
    p.add_argument("--memory", choices=MEMORY_MODES)
    precision_flags(p)
    p.add_argument("--calibration", metavar="DIR",
                   help="--precision int8 (or auto): a directory of .npz files, one input set each, to calibrate on")
    p.add_argument("--calibration-method", choices=CALIBRATIONS,
                   help="--precision int8: how activation ranges are chosen (default minmax)")
    p.add_argument("--threads", type=threads_arg)
    p.add_argument("--disable", action="append", metavar="PASS", help="disable a pass (repeatable)")
    p.add_argument("--example-input", action="append", metavar="1x3x224x224[:int64]",
                   help="for MODEL given as file.py:factory (a torch model): an input's shape (repeatable)")
    p.set_defaults(func=compile_command)
