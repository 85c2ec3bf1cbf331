"""Shape-chain folding: the Shape -> Gather / Slice -> Unsqueeze -> Concat -> Reshape chains
that exporters emit become constants when the dims they read are static.

- shape_of_static: ``Shape(x)`` (with opset-15 start / end) -> constant when those dims are
  static; ``size_of_static``: ``Size(x)`` likewise.
- gather_of_shape / slice_of_shape: ``Gather(Shape(x), i)`` and ``Slice(Shape(x), s, e)``
  (step 1) -> constant when the selected dims are static, even if other dims are symbolic.
- reshape_copy_dims: ``Reshape(x, Concat(...))`` whose parts are constants or single dims
  read from a shape (``Unsqueeze(Gather(Shape(y), i))``) that provably equal dim ``p`` of
  ``x`` at their own position ``p`` -> ``Reshape(x, constant)`` with 0 ("copy this dim") there
  (allowzero = 0 only). Makes dynamic-batch / dynamic-sequence reshapes constant.

Constant folding (``fold.py``) then evaluates whatever now has only constant inputs.
"""
from __future__ import annotations

import torch

from ..ir.shape import dims_equal
from .facts import const_of, ints_arg, producer
from .rule import Decline, Rule


def _const_ints(values, like_scalar: bool = False):
    t = torch.tensor(values, dtype=torch.int64)
    return t.reshape(()) if like_scalar else t


def shape_dims(shape_node):
    """The (possibly symbolic) dims a Shape node yields, or None when the rank is unknown."""
    s = shape_node.inputs[0].shape
    if s is None:
        return None
    start = int(shape_node.attrs.get("start", 0)) if shape_node.version >= 15 else 0
    end = shape_node.attrs.get("end") if shape_node.version >= 15 else None
    return list(s)[start:None if end is None else int(end)]


def _shape_of_static(node, ctx):
    dims = shape_dims(node)
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return _const_ints(dims)


def _size_of_static(node, ctx):
    s = node.inputs[0].shape
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    n = 1
    for d in s:
        n *= d
    return _const_ints(n, like_scalar=True)


def _gather_of_shape(node, ctx):
    sh = producer(node.inputs[0], "Shape")
    idx = const_of(node.input(1))
    if sh is None or idx is None or int(node.attrs.get("axis", 0)) != 0:
        return None
    dims = shape_dims(sh)
    if dims is None:
        return None
    picked = []
    for i in idx.reshape(-1).tolist():
        i = int(i) + len(dims) if int(i) < 0 else int(i)
        if not 0 <= i < len(dims) or not isinstance(dims[i], int):
            return None
        picked.append(dims[i])
    return torch.tensor(picked, dtype=torch.int64).reshape(idx.shape)


def _slice_of_shape(node, ctx):
    sh = producer(node.inputs[0], "Shape")
    if sh is None or node.version < 10:
        return None
    parts = [ints_arg(node, i, "", 10) for i in (1, 2, 3, 4)]
    if not all(k for k, _ in parts):
        return None
    (_, starts), (_, ends), (_, axes), (_, steps) = parts
    dims = shape_dims(sh)
    if dims is None or len(starts) != 1 or (axes not in (None, [0], [-1])) or (steps not in (None, [1])):
        return None
    picked = dims[starts[0]:ends[0]]
    if not all(isinstance(d, int) for d in picked):
        return None
    return _const_ints(picked)


def _dim_read(v):
    """(y, i) when ``v`` is a 1-element vector holding dim i of y's shape, else None."""
    g = producer(v, "Gather")
    if g is None:
        u = producer(v, "Unsqueeze")
        if u is None:
            return None
        known, axes = ints_arg(u, 1, "axes", 13)
        g = producer(u.inputs[0], "Gather")
        if not known or axes not in ([0], [-1]) or g is None or g.outputs[0].shape != ():
            return None
    sh, idx = producer(g.inputs[0], "Shape"), const_of(g.input(1))
    if sh is None or idx is None or idx.numel() != 1 or int(g.attrs.get("axis", 0)) != 0:
        return None
    dims = shape_dims(sh)
    if dims is None:
        return None
    i = int(idx.reshape(-1)[0])
    i = i + len(dims) if i < 0 else i
    start = int(sh.attrs.get("start", 0)) if sh.version >= 15 else 0
    full = sh.inputs[0].shape
    i = i + (start + len(full) if start < 0 else start)
    return (sh.inputs[0], i) if 0 <= i < len(full) else None


def _reshape_copy_dims(node, ctx):
    cat = producer(node.input(1), "Concat")
    x = node.inputs[0]
    if cat is None or node.version < 5 or int(node.attrs.get("allowzero", 0)) or x.shape is None:
        return None
    spec, copied = [], 0
    for part in cat.inputs:
        c = const_of(part)
        if c is not None:
            spec.extend(int(d) for d in c.reshape(-1).tolist())
            continue
        read = _dim_read(part)
        if read is None:
            return None
        y, i = read
        pos = len(spec)
        if pos >= len(x.shape) or not ((y is x and i == pos) or dims_equal(y.shape[i], x.shape[pos]) is True):
            return Decline(f"dim {pos} of the target is not provably dim {pos} of the input")
        spec.append(0)
        copied += 1
    return _const_ints(spec) if copied else None


def _const_rewrite(node, value, ctx):
    return ctx.const(value, "shape")


def _reshape_rewrite(node, spec, ctx):
    return ctx.emit("Reshape", [node.inputs[0], ctx.const(spec, "shape")], dict(node.attrs))


RULES = [
    Rule("shape_of_static", _shape_of_static, _const_rewrite, ops=("Shape",), doc="selected dims static"),
    Rule("size_of_static", _size_of_static, _const_rewrite, ops=("Size",), doc="all dims static"),
    Rule("gather_of_shape", _gather_of_shape, _const_rewrite, ops=("Gather",), doc="gathered dims static"),
    Rule("slice_of_shape", _slice_of_shape, _const_rewrite, ops=("Slice",), doc="step 1, sliced dims static"),
    Rule("reshape_copy_dims", _reshape_copy_dims, _reshape_rewrite, ops=("Reshape",),
         doc="allowzero=0; each dim read equals the input dim at its position"),
]
