"""Strides of the tensors the oneDNN kernels read and write, from the IR's layout choice.

``strides_of(value)``: channels-last strides for a 4-D value the layout pass made ``nhwc``,
row-major otherwise; ``same_layout(t, shape, strides)``: whether a tensor has them (a stride
of a dim of one element does not count). A kernel's output slot uses its own value's layout (so the layout probe
finds those strides and the arena view is made with them); an input slot uses its producer's.
"""
from __future__ import annotations

import torch


def contiguous(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(tuple(shape)):
        out.insert(0, acc)
        acc *= int(d)
    return tuple(out)


def channels_last(shape) -> tuple[int, ...]:
    n, c, *sp = (int(d) for d in shape)
    strides = [0] * (2 + len(sp))
    strides[1] = 1
    acc = c
    for i in range(len(sp) - 1, -1, -1):
        strides[2 + i] = acc
        acc *= sp[i]
    strides[0] = acc
    return tuple(strides)


def dtype_of(value):
    """The torch dtype of an IR value, or None when it has none."""
    return value.dtype.to_torch() if value.dtype is not None else None


def static_shape(value) -> tuple[int, ...] | None:
    s = value.shape if value is not None else None
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    return tuple(int(d) for d in s)


def strides_of(value) -> tuple[int, ...] | None:
    shape = static_shape(value)
    if shape is None:
        return None
    if value.layout == "nhwc" and len(shape) >= 3:
        return channels_last(shape)
    return contiguous(shape)


def same_layout(t: torch.Tensor, shape: tuple, strides: tuple) -> bool:
    """Whether ``t`` has ``shape`` and ``strides`` (those of dims of one element aside)."""
    if tuple(t.shape) != tuple(shape):
        return False
    return all(a == b for a, b, n in zip(t.stride(), strides, shape) if n != 1)
