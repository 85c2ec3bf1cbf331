"""The integer ops of shape arithmetic on Python values: what a model with symbolic input dims
computes from its inputs' shapes once per new input shape (``Gather(Shape(x), 2)``, the
``Unsqueeze`` / ``Concat`` of a reshape target, ``past + seq``), without a torch call per op.

Exporters write a reshape target or a position count as a chain of ONNX ops on tensors of one
to a few int64 elements. Run as kernels, each op is a torch call on a tiny tensor, paid for
every new input shape (a decoder's every token). Here such a tensor is a ``SmallInts``
(shape, flat tuple of values, torch dtype) and each op a few tuple operations. ``small_kernel(node)`` gives the op's function, or None where the op or its form
has none here: the function takes ``SmallInts`` (None for an absent optional input) and
returns a tuple of ``SmallInts``, or None where these operands' form is not handled (a rank,
a broadcast, a length above ``MAX_ELEMENTS``, a result outside its integer type), so that the
caller runs the op's kernel instead. ``SmallInts.tensor()`` makes the torch tensor once, for a
reader that needs one. The functions follow the ONNX semantics the ops' kernels implement
(``tests/ops/test_shape_ints.py`` checks them against ``onnx.reference``); an index out of
range raises ``IndexError``, as the kernels do.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..ir import Node
from ..ir.shape import broadcast_shapes
from .common import normalize_axis as _axis

MAX_ELEMENTS = 64            # a longer value is a tensor's work (a mask, position ids of a prompt)

_RANGES = {torch.int64: (-(1 << 63), (1 << 63) - 1), torch.int32: (-(1 << 31), (1 << 31) - 1),
           torch.int16: (-(1 << 15), (1 << 15) - 1), torch.int8: (-128, 127), torch.uint8: (0, 255)}
_KINDS = frozenset(_RANGES) | {torch.bool}
_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
          torch.uint8: np.uint8, torch.bool: np.bool_}


class SmallInts:
    """An integer or bool tensor of at most ``MAX_ELEMENTS`` elements held as Python values."""
    __slots__ = ("shape", "data", "dtype", "_tensor")

    def __init__(self, shape: tuple, data: tuple, dtype: torch.dtype):
        self.shape, self.data, self.dtype = shape, data, dtype
        self._tensor = None

    def tensor(self) -> torch.Tensor:
        """The torch tensor of these values (made once; readers must not write it)."""
        t = self._tensor
        if t is None:         # through numpy: cheaper than torch.tensor on a few values
            t = self._tensor = torch.from_numpy(np.array(self.data, dtype=_NUMPY[self.dtype]).reshape(self.shape))
        return t

    def same(self, other) -> bool:
        return other.__class__ is SmallInts and self.data == other.data and self.shape == other.shape \
            and self.dtype is other.dtype

    @staticmethod
    def of(t: torch.Tensor) -> "SmallInts | None":
        """``t``'s values, where it is a small integer or bool tensor on the CPU (else None)."""
        if t.dtype not in _KINDS or t.numel() > MAX_ELEMENTS or t.device.type != "cpu":
            return None
        got = SmallInts(tuple(t.shape), tuple(t.reshape(-1).tolist()), t.dtype)
        got._tensor = t
        return got

    def __repr__(self) -> str:
        return f"SmallInts({list(self.shape)}, {list(self.data)}, {self.dtype})"


def _fits(data, dtype) -> bool:
    if dtype is torch.bool:
        return True
    lo, hi = _RANGES[dtype]
    for x in data:
        if not lo <= x <= hi:
            return False
    return True


def _result(shape: tuple, data: tuple, dtype) -> "SmallInts | None":
    return SmallInts(shape, data, dtype) if len(data) <= MAX_ELEMENTS and _fits(data, dtype) else None


def _operands(args: tuple) -> tuple | None:
    """The flat values of elementwise operands at their broadcast shape, where each is either
    of that shape (leading ones aside) or of one element (the forms shape arithmetic writes);
    None otherwise."""
    try:
        shape = broadcast_shapes(*(a.shape for a in args))
    except ValueError:
        return None                                   # the kernel says why
    n = 1
    for d in shape:
        n *= d
    flats = []
    for a in args:
        if a.shape == shape or (1,) * (len(shape) - len(a.shape)) + a.shape == shape:
            flats.append(a.data)
        elif len(a.data) == 1:
            flats.append(a.data * n)
        else:
            return None
    return shape, flats


def _elementwise(fn: Callable, out_dtype=None) -> Callable:
    def kernel(*args):
        if len(args) != 2 or None in args:            # Max / Min of one or of three: the kernel's
            return None
        a, b = args
        if a.dtype is not b.dtype or a.dtype is torch.bool:
            return None
        if len(a.data) == 1 and len(b.data) == 1:     # one element each: the longer shape (all ones)
            out = _result(a.shape if len(a.shape) >= len(b.shape) else b.shape, (fn(a.data[0], b.data[0]),),
                          out_dtype or a.dtype)
            return None if out is None else (out,)
        got = _operands((a, b))
        if got is None:
            return None
        shape, (x, y) = got
        out = _result(shape, tuple(map(fn, x, y)), out_dtype or a.dtype)
        return None if out is None else (out,)
    return kernel


def _where(cond, x, y):
    if cond.dtype is not torch.bool or x.dtype is not y.dtype:
        return None
    got = _operands((cond, x, y))
    if got is None:
        return None
    shape, (c, a, b) = got
    return (SmallInts(shape, tuple(p if k else q for k, p, q in zip(c, a, b)), x.dtype),)


def _gather(node: Node) -> Callable:
    axis = int(node.attrs.get("axis", 0))

    def kernel(data, idx):
        if len(data.shape) != 1 or idx.dtype not in (torch.int64, torch.int32):
            return None
        _axis(axis, 1)
        n = data.shape[0]
        out = []
        for i in idx.data:
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of range for a dimension of {n}")
            out.append(data.data[i])
        return (SmallInts(idx.shape, tuple(out), data.dtype),)
    return kernel


def _axes_of(node: Node, given) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    return list(given.data) if given is not None else None


def _unsqueeze(node: Node) -> Callable:
    placed: dict[tuple, tuple | None] = {}        # (input rank, axes) -> the output shape's ones, in order

    def kernel(data, axes=None):
        wanted = _axes_of(node, axes)
        if wanted is None:
            return None
        key = (len(data.shape), tuple(wanted))
        at = placed.get(key, False)
        if at is False:
            rank = len(data.shape) + len(wanted)
            at = tuple(sorted(_axis(a, rank) for a in wanted))
            at = placed[key] = at if len(set(at)) == len(at) else None
        if at is None:
            return None
        shape = list(data.shape)
        for a in at:
            shape.insert(a, 1)
        return (SmallInts(tuple(shape), data.data, data.dtype),)
    return kernel


def _squeeze(node: Node) -> Callable:
    def kernel(data, axes=None):
        wanted = _axes_of(node, axes)
        if wanted is None:
            drop = {i for i, d in enumerate(data.shape) if d == 1}
        else:
            drop = {_axis(a, len(data.shape)) for a in wanted}
            if any(data.shape[a] != 1 for a in drop):
                return None
        return (SmallInts(tuple(d for i, d in enumerate(data.shape) if i not in drop), data.data, data.dtype),)
    return kernel


def _concat(node: Node) -> Callable:
    axis = int(node.attrs["axis"])

    def kernel(*parts):
        present = [p for p in parts if p is not None]
        if not present or any(len(p.shape) != 1 or p.dtype is not present[0].dtype for p in present):
            return None
        _axis(axis, 1)
        data = tuple(x for p in present for x in p.data)
        return None if len(data) > MAX_ELEMENTS else (SmallInts((len(data),), data, present[0].dtype),)
    return kernel


def _shape_of(node: Node) -> Callable:
    start, end = node.attrs.get("start"), node.attrs.get("end")

    def kernel(shape: tuple):
        dims = tuple(shape[slice(start, end)])
        return (SmallInts((len(dims),), dims, torch.int64),)
    return kernel


def _size(node: Node) -> Callable:
    def kernel(shape: tuple):
        n = 1
        for d in shape:
            n *= d
        return (SmallInts((), (n,), torch.int64),)
    return kernel


def _cast(node: Node) -> Callable:
    to = node.outputs[0].dtype.to_torch()     # no dtype: AttributeError, no function (``small_kernel``)

    def kernel(x):
        if to is torch.bool:
            return (SmallInts(x.shape, tuple(v != 0 for v in x.data), to),)
        if to not in _RANGES:
            return None
        data = tuple(int(v) for v in x.data)
        return (SmallInts(x.shape, data, to),) if _fits(data, to) else None
    return kernel


def _range(start, limit, delta):
    if start.shape or limit.shape or delta.shape or start.dtype not in (torch.int64, torch.int32) \
            or not (start.dtype is limit.dtype is delta.dtype):
        return None
    s, e, d = start.data[0], limit.data[0], delta.data[0]
    if d == 0:
        raise ValueError("Range with a delta of 0")
    n = max(-(-(e - s) // d), 0)
    if n > MAX_ELEMENTS:
        return None
    return (SmallInts((n,), tuple(s + i * d for i in range(n)), start.dtype),)


def _slice(node: Node) -> Callable:
    def kernel(data, starts, ends, axes=None, steps=None):
        if len(data.shape) != 1 or len(starts.data) != 1 or len(ends.data) != 1:
            return None
        if axes is not None and axes.data not in ((0,), (-1,)):
            return None
        step = steps.data[0] if steps is not None and len(steps.data) == 1 else (1 if steps is None else 0)
        if step <= 0:
            return None                       # a reversed slice's clamping differs from Python's
        picked = data.data[slice(starts.data[0], ends.data[0], step)]
        return (SmallInts((len(picked),), picked, data.dtype),)
    return kernel


def _fixed(fn: Callable) -> Callable:
    return lambda node: fn


_BUILDERS: dict[str, Callable[[Node], Callable]] = {
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Shape": _shape_of,
    "Size": _size,
    "Cast": _cast,
    "Slice": _slice,
    "Range": _fixed(_range),
    "Where": _fixed(_where),
    "Add": _fixed(_elementwise(lambda x, y: x + y)),
    "Sub": _fixed(_elementwise(lambda x, y: x - y)),
    "Mul": _fixed(_elementwise(lambda x, y: x * y)),
    "Equal": _fixed(_elementwise(lambda x, y: x == y, torch.bool)),
    "Less": _fixed(_elementwise(lambda x, y: x < y, torch.bool)),
    "Greater": _fixed(_elementwise(lambda x, y: x > y, torch.bool)),
    "LessOrEqual": _fixed(_elementwise(lambda x, y: x <= y, torch.bool)),
    "GreaterOrEqual": _fixed(_elementwise(lambda x, y: x >= y, torch.bool)),
    "Max": _fixed(_elementwise(max)),
    "Min": _fixed(_elementwise(min)),
}


def small_kernel(node: Node) -> Callable | None:
    """The op's function on ``SmallInts`` (``Shape`` / ``Size``: on the input's shape tuple),
    or None where it has none here: ``Slice`` before opset 10 (attributes), ops of other
    domains, and a node whose attributes or output type the function cannot be made from (the
    op's kernel says what is wrong with it)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    build = _BUILDERS.get(node.op_type)
    if build is None or (node.op_type == "Slice" and node.version < 10):
        return None
    try:
        return build(node)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
