"""What a shape tensor holds, read symbolically from the graph that computes it.

Exporters build reshape targets, expand shapes and ``Range`` limits from the shapes of
activations: ``Concat(Unsqueeze(Gather(Shape(x), 0)), [12], ...)``. With symbolic dims those
are not constants, yet their entries are known: dims of ``x``. ``shape_vector(v)`` reads a 1-D
integer value through ``Concat`` / ``Unsqueeze`` / ``Shape`` / ``Slice`` / constants into a
list of ints and symbols (``None``: an entry not known); ``shape_scalar(v)`` reads a
one-element integer (``Gather(Shape(x), i)``, through casts to an integer type and
one-element reshapes); ``expand_target(v)`` reads an ``Expand`` target, also through the
exporters' ``Where(Equal(t, -1), 1, t)``. The ops' shape inference uses them (``Reshape`` /
``Expand`` targets, ``Range`` lengths), and so do the fusion rules that must prove a reshape
is a no-op. Pure reads of the graph: nothing is evaluated or changed.
"""
from __future__ import annotations

from ..ir import DType, Value

_ONE_ELEMENT_SAME = ("Squeeze", "Unsqueeze", "Reshape", "Identity", "Cast")
_INTEGER = (DType.INT64, DType.INT32)


def _const(v: Value | None):
    return v.const if v is not None and v.is_const else None


def _default(v: Value | None, *ops: str):
    p = v.producer if v is not None else None
    return p if p is not None and p.domain in ("", "ai.onnx") and p.op_type in ops else None


def shape_vector(v: Value | None, depth: int = 8) -> list | None:
    """The entries of a 1-D integer value as ints or symbolic dims (``None``: an entry not
    known, such as a sum of two dims), read through Concat / Unsqueeze / Shape / Slice /
    one-axis Reshape / constants; None if not readable."""
    if v is None or depth == 0:
        return None
    c = _const(v)
    if c is not None:
        return [int(x) for x in c.reshape(-1).tolist()]
    p = _default(v, "Concat", "Unsqueeze", "Shape", "Slice", "Cast", "Identity", "Reshape")
    if p is None:
        return None
    if p.op_type == "Reshape":              # a vector reshaped to one axis ([-1] or [n]) is itself
        target = _const(p.inputs[1]) if len(p.inputs) > 1 else None
        src = p.inputs[0]
        if target is None or target.numel() != 1 or src.shape is None or len(src.shape) != 1 or \
                int(target.reshape(-1)[0]) not in (-1, src.shape[0]):
            return None
        return shape_vector(src, depth - 1)
    if p.op_type == "Concat" and int(p.attrs.get("axis", 0)) == 0:
        parts = [shape_vector(x, depth - 1) for x in p.inputs]
        return None if any(x is None for x in parts) else [d for part in parts for d in part]
    if p.op_type == "Unsqueeze" and v.shape == (1,):     # one entry, unknown (None) if unreadable
        return [shape_scalar(p.inputs[0], depth - 1)]
    if p.op_type == "Shape" and not p.attrs.get("start") and p.attrs.get("end") is None:
        return list(p.inputs[0].shape) if p.inputs[0].shape is not None else None
    if p.op_type in ("Cast", "Identity"):
        if p.op_type == "Cast" and DType(int(p.attrs.get("to", 0))) not in _INTEGER:
            return None
        return shape_vector(p.inputs[0], depth - 1)
    if p.op_type == "Slice" and p.version >= 10:
        src = shape_vector(p.inputs[0], depth - 1)
        args = [_const(p.input(i)) for i in range(1, 5)]
        if src is None or any(a is None for a in args[:2]) or any(
                a is not None and (a.numel() != 1 or int(a.reshape(-1)[0]) != want)
                for a, want in ((args[2], 0), (args[3], 1))):
            return None
        return src[int(args[0].reshape(-1)[0]):int(args[1].reshape(-1)[0])]
    return None


def shape_scalar(v: Value | None, depth: int = 8):
    """The value of a one-element integer ``v`` when it is a constant or a dim read from a
    shape (``Gather(Shape(x), i)``, a one-element ``Squeeze`` of a shape vector), through
    casts to an integer type and one-element reshapes: an int or a symbol; else None."""
    if v is None or depth == 0 or (v.shape is not None and any(d != 1 for d in v.shape)):
        return None
    c = _const(v)
    if c is not None:
        return int(c.reshape(-1)[0]) if c.numel() == 1 and not c.is_floating_point() else None
    p = _default(v, "Gather", *_ONE_ELEMENT_SAME)
    if p is None:
        return None
    if p.op_type in _ONE_ELEMENT_SAME:
        if p.op_type == "Cast" and DType(int(p.attrs.get("to", 0))) not in _INTEGER:
            return None
        src = shape_vector(p.inputs[0], depth - 1) if p.op_type == "Squeeze" else None
        if src is not None:
            return src[0] if len(src) == 1 else None
        return shape_scalar(p.inputs[0], depth - 1)
    if int(p.attrs.get("axis", 0)) != 0:
        return None
    src, idx = shape_vector(p.inputs[0], depth - 1), _const(p.inputs[1])
    if src is None or idx is None or idx.numel() != 1:
        return None
    i = int(idx.reshape(-1)[0])
    return src[i] if -len(src) <= i < len(src) else None


def _all(v: Value | None, k: int, depth: int = 3) -> bool:
    """Every element of integer ``v`` is ``k``: a constant, ``ConstantOfShape(value=k)``, or a
    product of such (the exporters' ``ones * -1``)."""
    if v is None or depth == 0:
        return False
    c = _const(v)
    if c is not None:
        return c.numel() > 0 and not c.is_floating_point() and bool((c == k).all())
    p = _default(v, "ConstantOfShape", "Mul")
    if p is None:
        return False
    if p.op_type == "ConstantOfShape":
        value = p.attrs.get("value")
        return value is not None and value.numel() == 1 and not value.is_floating_point() and int(value.reshape(-1)[0]) == k
    a, b = p.inputs[0], p.inputs[1]
    return (_all(a, 1, depth - 1) and _all(b, k, depth - 1)) or (_all(a, k, depth - 1) and _all(b, 1, depth - 1))


def expand_target(v: Value | None) -> list | None:
    """The entries of an Expand's target shape (``shape_vector``), also through the exporters'
    ``Where(Equal(t, -1), ones, t)``: an entry of t that is a size or a symbolic dim (never -1)
    is itself there, a -1 becomes 1, an unknown entry stays unknown (``None``); None when the
    vector is unreadable."""
    w = _default(v, "Where")
    if w is None:
        return shape_vector(v)
    eq = _default(w.inputs[0], "Equal")
    if eq is None or w.inputs[2] not in eq.inputs:
        return None
    other = eq.inputs[1] if eq.inputs[0] is w.inputs[2] else eq.inputs[0]
    t = shape_vector(w.inputs[2])
    if t is None or not _all(other, -1):
        return None
    if any(e == -1 for e in t) and not _all(w.inputs[1], 1):
        return None
    return [1 if e == -1 else e for e in t]
