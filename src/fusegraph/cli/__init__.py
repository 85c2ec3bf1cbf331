"""The ``fusegraph`` command line (``main.py``), one module per subcommand group."""
from .main import build_parser, main

__all__ = ["build_parser", "main"]
