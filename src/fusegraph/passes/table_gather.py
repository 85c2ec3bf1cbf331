"""Gathers from a constant table whose indices a constant makes predictable: rows read as a
view of the table instead of copied out of it.

Exporters write a transformer's position and token-type embeddings as ``Gather(table, ids)``
where the ids come from a constant buffer: ``position_ids[:, :seq]`` (a ``Slice`` of a constant
``arange``) and ``token_type_ids[:, :seq].expand(batch, seq)`` (a buffer of zeros, sliced,
expanded, gathered). With a symbolic sequence the ids are not constants, so the gather runs
once per input shape and copies ``seq`` rows of the table into memory a frame holds
(``runtime/frames.py``). Both forms have a copy-free equivalent:

- ``gather_by_slice_of_range``: ``Gather(T, Slice(R, s, e, [a]))`` where ``R`` is a constant
  whose values along axis ``a`` are ``0 .. N-1`` (every other axis of size 1) and ``T`` has
  exactly ``N`` rows -> ``Unsqueeze(Slice(T, s, e, [0]))`` (back to the ids' rank). Exact: the
  slice of ``R`` picks rows ``s' .. e'-1`` after clamping to ``N``, the slice of ``T`` the same
  rows under the same clamping. The slice of a constant is a view.
- ``gather_of_uniform``: ``Gather(T, I)`` where every element of ``I`` provably equals one
  constant ``c`` (a constant filled with ``c``, through ``Slice`` / ``Expand`` / ``Reshape`` /
  ``Unsqueeze`` / ``Squeeze`` / ``Flatten`` / ``Identity`` / ``Transpose`` / ``Tile`` of it, or
  ``Gather`` / ``GatherElements`` reading it) -> ``Expand(T[c] as [1, .., 1, D..], Concat(
  Shape(I), [1, ..]))``: row ``c`` repeated by a stride-0 view. ``I`` is still computed (its
  shape is read), so an index out of range still fails where it did.

Both need an int64 / int32 index, ``axis`` 0, and the default opset at 13 or later (``Slice``
and ``Unsqueeze`` with their arguments as inputs).
"""
from __future__ import annotations

import torch

from .facts import const_of, ints_arg, producer
from .rule import Rule

INDEX_TYPES = (torch.int64, torch.int32)
UNIFORM_THROUGH = ("Slice", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Transpose", "Tile")
UNIFORM_DEPTH = 16            # producers followed back from an index before giving up


def _table(node, ctx):
    """The gathered constant table of a rewritable Gather (axis 0, rank >= 1), else None."""
    table = const_of(node.inputs[0])
    if table is None or table.dim() < 1 or int(node.attrs.get("axis", 0)) not in (0, -table.dim()):
        return None
    if ctx.graph.opset.get("", 1) < 13 or node.inputs[1].dtype is None:
        return None
    return table


def _gather_by_slice_of_range(node, ctx):
    table = _table(node, ctx)
    sl = producer(node.inputs[1], "Slice")
    if table is None or sl is None or sl.version < 10:
        return None
    ids = const_of(sl.inputs[0])
    if ids is None or ids.dtype not in INDEX_TYPES or ids.dim() < 1:
        return None
    known_axes, axes = ints_arg(sl, 3, "axes", 10)
    known_steps, steps = ints_arg(sl, 4, "steps", 10)
    if not known_axes or not known_steps or steps not in (None, [1]) or (axes is not None and len(axes) != 1):
        return None
    if any(sl.input(i) is None or sl.input(i).shape != (1,) for i in (1, 2)):
        return None                       # one start and one end: one axis sliced
    axis = axes[0] if axes is not None else 0
    axis = axis + ids.dim() if axis < 0 else axis
    n = ids.shape[axis] if 0 <= axis < ids.dim() else -1
    if n != table.shape[0] or any(d != 1 for i, d in enumerate(ids.shape) if i != axis):
        return None
    if not torch.equal(ids.reshape(-1).to(torch.int64), torch.arange(n)):
        return None
    return axis, ids.dim()


def _slice_rewrite(node, found, ctx):
    axis, rank = found
    sl = node.inputs[1].producer
    starts, ends = sl.inputs[1], sl.inputs[2]
    rows = ctx.emit("Slice", [node.inputs[0], starts, ends, ctx.const(torch.tensor([0]), "axes")])
    others = [i for i in range(rank) if i != axis]
    if not others:
        return rows
    return ctx.emit("Unsqueeze", [rows, ctx.const(torch.tensor(others), "unsqueeze_axes")])


def _uniform_value(v, depth: int = UNIFORM_DEPTH):
    """The one value every element of ``v`` holds, where provable (an int), else None."""
    for _ in range(depth):
        if v is None:
            return None
        c = const_of(v)
        if c is not None:
            if c.numel() == 0 or c.dtype not in INDEX_TYPES:
                return None
            first = c.reshape(-1)[0]
            return int(first) if bool((c == first).all()) else None
        p = v.producer
        if p is None or p.domain != "":
            return None
        if p.op_type in UNIFORM_THROUGH:
            v = p.inputs[0]
        elif p.op_type in ("Gather", "GatherElements"):
            v = p.inputs[0]              # what it reads from, wherever it reads
        else:
            return None
    return None


def _gather_of_uniform(node, ctx):
    table = _table(node, ctx)
    idx = node.inputs[1]
    if table is None or const_of(idx) is not None or idx.shape is None:
        return None
    c = _uniform_value(idx)
    if c is None or not -table.shape[0] <= c < table.shape[0]:
        return None
    return c


def _uniform_rewrite(node, c, ctx):
    table = const_of(node.inputs[0])
    rank = len(node.inputs[1].shape)
    row = table[c].reshape((1,) * rank + tuple(table.shape[1:]))
    shape = ctx.emit("Shape", [node.inputs[1]])
    target = ctx.emit("Concat", [shape, ctx.const(torch.ones(table.dim() - 1, dtype=torch.int64), "row_dims")],
                      {"axis": 0})
    return ctx.emit("Expand", [ctx.const(row, "row"), target])


RULES = [
    Rule("gather_by_slice_of_range", _gather_by_slice_of_range, _slice_rewrite, ops=("Gather",),
         doc="the ids a slice of a constant 0..N-1 along one axis (others 1), the table N rows, step 1"),
    Rule("gather_of_uniform", _gather_of_uniform, _uniform_rewrite, ops=("Gather",),
         doc="every index provably one constant inside the table"),
]
