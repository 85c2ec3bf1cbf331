"""Fold a per-channel constant Mul or Add that follows a convolution into its weights.

``Conv(x, W, b) * c -> Conv(x, W*c, b*c)`` and ``Conv(x, W, b) + c -> Conv(x, W, b+c)``,
where ``c`` is constant and varies at most along the output-channel axis (shape ``[M,1,1]``,
``[1,M,1,1]``, a scalar, ...). Condition: W (and b when present) constant, the Conv's output
used only by this node and unflagged, float types, new weights within the fold size limit.
Equal up to rounding (the products are taken in float64). This is what makes a BatchNorm
after a conv (see ``batchnorm.py``) free; onnxruntime does the same at ORT_ENABLE_BASIC.
"""
from __future__ import annotations

from .facts import const_of, only_use, producer, shapes_equal
from .rewrite import nbytes_of
from .rule import Decline, Rule


def _channel_vector(c, rank: int, channels: int):
    """``c`` as a flat per-channel vector of length ``channels``, or None when it varies on
    another axis or has higher rank than the conv output."""
    if c.dim() > rank:
        return None
    full = (1,) * (rank - c.dim()) + tuple(c.shape)
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
        return None
    return c.reshape(-1).double().expand(channels)


def _check(node, ctx):
    for side in (0, 1):
        conv = producer(node.inputs[side], "Conv")
        c = const_of(node.inputs[1 - side])
        if conv is not None and c is not None:
            break
    else:
        return None
    y = conv.outputs[0]
    if not only_use(y):
        return Decline("the conv output has other users (or is flagged / a graph output)")
    w, b = const_of(conv.input(1)), const_of(conv.input(2)) if conv.input(2) is not None else None
    if w is None or (conv.input(2) is not None and b is None):
        return Decline("conv weights / bias are not constant")
    if y.shape is None or not y.dtype.is_float or not shapes_equal(y.shape, node.outputs[0].shape):
        return Decline("output shape unknown, not float, or broadcast by the constant")
    vec = _channel_vector(c, len(y.shape), w.shape[0])
    if vec is None:
        return Decline("the constant varies along an axis other than the output channels")
    if not ctx.can_materialise(nbytes_of(tuple(w.shape), y.dtype)):
        return Decline("new weights would exceed the fold size limit")
    bias = b.double() if b is not None else vec.new_zeros(w.shape[0])
    if node.op_type == "Mul":
        w2 = w.double() * vec.reshape((-1,) + (1,) * (w.dim() - 1))
        return conv, w2.to(w.dtype), (bias * vec).to(w.dtype)
    return conv, w, (bias + vec).to(w.dtype)


def _rewrite(node, match, ctx):
    conv, w, b = match
    weight = conv.inputs[1] if w is conv.inputs[1].const else ctx.const(w, "weight")
    return ctx.emit("Conv", [conv.inputs[0], weight, ctx.const(b, "bias")], dict(conv.attrs))


RULES = [Rule("conv_affine_fold", _check, _rewrite, ops=("Mul", "Add"),
              doc="constant per-output-channel operand, constant conv weights, conv output used once")]
