"""Names from a model, made safe to print on a terminal.

A node, value or graph name comes from the model file (or a re-sealed artifact) and may hold
control characters: an ESC sequence that recolours or clears the terminal, a CR that
overwrites the start of the line, a NUL, a bidi override that reorders what follows, a line
separator. Every text rendering of a report, the IR listing and the ``fusegraph`` command's
tables pass such names through ``printable``, which writes each character that
``str.isprintable`` rejects as its Python escape (``\\x1b``, ``\\r``, ``\\x00``, ``\\u202e``),
as ``repr`` would, and leaves every other character (non-ASCII letters included) as it is.
"""
from __future__ import annotations


def _escape(ch: str) -> str:
    return repr(ch)[1:-1]


def printable(text: object) -> str:
    """``str(text)`` with every non-printable character escaped (newlines too: one name, one line)."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def printable_lines(text: object) -> str:
    """``printable`` per line: a multi-line message keeps its line breaks, nothing else."""
    return "\n".join(printable(line) for line in str(text).split("\n"))
