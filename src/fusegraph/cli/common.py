"""What the ``fusegraph`` subcommands share: the model a command runs (compiled, or an ``.fgm``
loaded), the ``fg.Config`` its flags ask for, input files, argument types, and the one-line
summaries several commands print. No command lives here.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..config import LEVELS, PRECISIONS, machine_cores
from ..errors import ConfigError, InputError, UsageError
from ..report.summary import precision_text

COMPILE_FLAGS = ("level", "memory", "precision", "op_precision", "num_streams")   # options that only mean something when compiling


def load_model(path: str, args):
    """An .fgm artifact loads without compiling (compile options are refused for it, not
    ignored); anything else is compiled."""
    import fusegraph as fg
    if Path(path).suffix == ".fgm":
        given = [f"--{k.replace('_', '-')}" for k in COMPILE_FLAGS if getattr(args, k, None)]
        if given:
            raise UsageError(f"{path}: {' and '.join(given)} applies when compiling a model; an .fgm "
                             f"artifact is already compiled (recompile the .onnx model instead)")
        return fg.load(path, threads=getattr(args, "threads", None))
    from ..frontends.python_model import resolve_model_arg
    source, inputs = resolve_model_arg(path)     # file.py:factory builds a torch model
    return fg.compile(source, config=config_from_args(args), example_inputs=inputs)


def config_from_args(args):
    """The ``fg.Config`` a command's arguments ask for: the ``--config`` TOML file's where the
    command has one (else the defaults), then every flag the command has and was given (a
    ``--op-precision`` name given here wins over the file's; ``--disable`` adds to its list)."""
    import fusegraph as fg
    config = fg.load_config(args.config) if getattr(args, "config", None) else fg.Config()
    changes = {k: getattr(args, k) for k in ("level", "memory", "precision", "threads")
               if getattr(args, k, None) is not None}
    if getattr(args, "calibration_method", None) is not None:
        changes["calibration"] = args.calibration_method
    streams = getattr(args, "streams", None)        # inspect's --streams is a switch, not a count
    if streams is not None and not isinstance(streams, bool):
        changes["streams"] = streams
    if getattr(args, "num_streams", None) is not None:   # inspect --num-streams N compiles for N
        changes["streams"] = args.num_streams
    if getattr(args, "disable", None):
        changes["disabled_passes"] = tuple(config.disabled_passes) + tuple(args.disable)
    ops = op_precision_arg(getattr(args, "op_precision", None))
    if ops:
        changes["op_precision"] = tuple({**dict(config.op_precision), **dict(ops)}.items())
    return config.replace(**changes) if changes else config


def random_feeds(model, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for ``model``'s inputs (its symbolic dims at 1)."""
    from ..runtime.feeds import random_feeds as feeds_for
    return feeds_for(model.inputs, seed)


def parse_inputs(items: list[str]) -> dict[str, np.ndarray]:
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


MAX_CALIBRATION_FILES = 1024
MAX_CALIBRATION_BYTES = 4 << 30          # the arrays of every file together, uncompressed


def read_calibration_dir(path: str) -> list[dict[str, np.ndarray]]:
    """``--calibration DIR``: one feed per ``.npz`` file of DIR (its arrays named by the model's
    inputs), in file-name order. At most ``MAX_CALIBRATION_FILES`` files and
    ``MAX_CALIBRATION_BYTES`` of arrays (each member's uncompressed size is read from the zip
    directory before anything is loaded); no pickle (``allow_pickle=False``). Whether the names
    and shapes fit the model is checked by ``fg.compile`` (an InputError naming the file's
    position)."""
    import zipfile
    root = Path(path)
    if not root.is_dir():
        raise InputError(f"--calibration expects a directory of .npz files (one per input set), got {path!r}")
    files = sorted(p for p in root.iterdir() if p.suffix == ".npz" and p.is_file())
    if not files:
        raise InputError(f"--calibration {path}: no .npz file there (write each input set with "
                         f"numpy.savez(file, input_name=array, ...))")
    if len(files) > MAX_CALIBRATION_FILES:
        raise InputError(f"--calibration {path}: {len(files)} .npz files, more than {MAX_CALIBRATION_FILES}")
    feeds, total = [], 0
    for f in files:
        try:
            with zipfile.ZipFile(f) as z:
                total += sum(i.file_size for i in z.infolist())
            if total > MAX_CALIBRATION_BYTES:
                raise InputError(f"--calibration {path}: the arrays hold more than {MAX_CALIBRATION_BYTES >> 30} GiB "
                                 f"(reached at {f.name})")
            with np.load(f, allow_pickle=False) as data:
                feeds.append({k: data[k] for k in data.files})
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise InputError(f"--calibration {path}: cannot read {f.name} as a .npz file of arrays: {exc}") from None
    return feeds


def op_precision_arg(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--op-precision NAME=PREC`` items (repeatable; a later one for the same name wins) as
    ``Config.op_precision`` pairs; the values are checked by ``Config`` (a ConfigError)."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, prec = item.rpartition("=")
        if not sep or not name:
            raise ConfigError(f"--op-precision expects NODE_OR_OP=fp32|bf16|fp16|int8 (e.g. Conv=bf16), got {item!r}")
        out[name] = prec
    return tuple(out.items())


def precision_line(report) -> str | None:
    """One line about ``report.precision`` (None for a plain fp32 compile; names escaped)."""
    return precision_text(report.precision)


def threads_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= machine_cores():
        raise argparse.ArgumentTypeError(f"expected an integer 1..{machine_cores()} (this machine's cores), "
                                         f"got {text!r}")
    return n


def dim_arg(text: str) -> tuple[str, int]:
    name, sep, size = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE (a symbolic dim and its size), got {text!r}")
    return name, positive_int(size, f"a positive size for dim {name!r}")


def positive_int(text: str, what: str = "a positive integer") -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return n


def stream_count(text: str):
    return text if text == "auto" else positive_int(text, "a positive integer or 'auto'")


def precision_flags(p) -> None:
    """``--precision`` and ``--op-precision`` (values checked by ``fg.Config``: a ConfigError)."""
    p.add_argument("--precision", metavar="|".join(PRECISIONS),
                   help="mixed-precision policy (default fp32; compare: the reduced side)")
    p.add_argument("--op-precision", action="append", metavar="NODE_OR_OP=PREC",
                   help="per node name or op type: fp32 | bf16 | fp16 (under --precision int8: int8 | fp32), "
                        "over the policy (repeatable)")


def model_flags(p) -> None:
    """The positional MODEL and the flags every command that compiles or loads one takes."""
    p.add_argument("model", help="an .onnx model or .fgm artifact")
    p.add_argument("--level", choices=LEVELS, help="pass pipeline (default O2)")
    p.add_argument("--threads", type=threads_arg, help="intra-op threads (1 .. the machine's cores)")
    precision_flags(p)
