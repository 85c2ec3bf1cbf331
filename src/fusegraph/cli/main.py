"""The ``fusegraph`` command: a thin face over the public API (no logic the API lacks).

One module per subcommand group registers its parsers: ``run.py`` (run, inspect),
``compile.py``, ``measure.py`` (bench, compare, demo), ``explain.py`` (profile, bisect,
inspect --html), ``serve.py``; ``common.py`` holds what they share.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import FusegraphError
from ..report.printable import printable_lines
from ..report.version import FUSEGRAPH_VERSION
from .compile import add_compile_parser
from .explain import add_report_parsers
from .measure import add_measure_parsers
from .run import add_run_parsers
from .serve import add_serve_parser


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fusegraph", description="graph engine for deep-learning inference")
    ap.add_argument("--version", action="version", version=f"fusegraph {FUSEGRAPH_VERSION}")
    sub = ap.add_subparsers(dest="command", required=True)
    add_run_parsers(sub)
    add_compile_parser(sub)
    add_measure_parsers(sub)
    add_serve_parser(sub)
    add_report_parsers(sub)       # profile, bisect, inspect --html (after inspect)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FusegraphError as exc:
        print(f"fusegraph: error: {printable_lines(exc)}", file=sys.stderr)   # names from the model escaped
        return 2
    except OSError as exc:   # a path the command was given cannot be read or written
        where = f" {exc.filename}" if exc.filename else ""
        print(f"fusegraph: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
