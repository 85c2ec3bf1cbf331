"""Shapes with symbolic dimensions.

A shape is ``None`` (rank unknown) or a tuple whose dims are ``int`` (static), ``str``
(a named symbolic dim such as ``"batch"``) or ``None`` (unknown). Helpers here are pure.
"""
from __future__ import annotations

from typing import Optional, Union

Dim = Union[int, str, None]
Shape = Optional[tuple]


def is_static(shape: Shape) -> bool:
    """True when the rank and every dim are known integers."""
    return shape is not None and all(isinstance(d, int) for d in shape)


def numel(shape: Shape) -> int | None:
    """Number of elements, or None when not static."""
    if not is_static(shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def format_shape(shape: Shape) -> str:
    if shape is None:
        return "[*]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True / False when decidable, None when either side is unknown or symbolic-vs-int."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, str) and isinstance(b, str) and a == b:
        return True
    return None


def broadcast_shapes(*shapes: Shape) -> Shape:
    """Numpy-style multidirectional broadcast; raises ValueError on a static mismatch."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        result: Dim = 1
        for d in dims:
            if d == 1:
                continue
            if result == 1:
                result = d
            elif isinstance(result, int) and isinstance(d, int):
                if result != d:
                    raise ValueError(f"cannot broadcast shapes {[format_shape(s) for s in shapes]}")
            elif result != d:
                # symbolic vs anything else: keep the static one if present, else unknown
                result = result if isinstance(result, int) else (d if isinstance(d, int) else None)
        out.append(result)
    return tuple(out)
