"""Inference BatchNormalization becomes a per-channel Mul and Add.

``y = (x - mean) / sqrt(var + eps) * scale + B`` is ``x * s + t`` with
``s = scale / sqrt(var + eps)`` and ``t = B - mean * s``, computed in float64 at compile time
and stored as ``[C, 1, ..., 1]`` constants. Condition: inference mode (no training_mode, no
used running-stat outputs, ``spatial`` = 1), scale / B / mean / var constant, float input of
known rank >= 2. Equal up to rounding. A later fusion (or ``conv_affine_fold``) folds the
Mul and Add into a preceding convolution.
"""
from __future__ import annotations

import torch

from .facts import const_of
from .rule import Decline, Rule


def _check(node, ctx):
    x = node.inputs[0]
    if any(o.uses or o.is_graph_output for o in node.outputs[1:]):
        return Decline("training outputs (running mean / var) are used")
    if int(node.attrs.get("training_mode", 0)) or not int(node.attrs.get("spatial", 1)):
        return Decline("training mode or spatial=0")
    consts = [const_of(node.input(i)) for i in (1, 2, 3, 4)]
    if any(c is None for c in consts):
        return Decline("scale, bias, mean and variance must be constants")
    if x.shape is None or len(x.shape) < 2 or not x.dtype.is_float:
        return Decline("input rank unknown (or < 2) or not floating point")
    scale, bias, mean, var = (c.double().reshape(-1) for c in consts)
    eps = float(node.attrs.get("epsilon", 1e-5))
    s = scale / torch.sqrt(var + eps)
    t = bias - mean * s
    view = (-1,) + (1,) * (len(x.shape) - 2)
    dtype = x.dtype.to_torch()
    return s.reshape(view).to(dtype), t.reshape(view).to(dtype)


def _rewrite(node, match, ctx):
    s, t = match
    y = ctx.emit("Mul", [node.inputs[0], ctx.const(s, "scale")])
    return [ctx.emit("Add", [y, ctx.const(t, "shift")])] + [None] * (len(node.outputs) - 1)


RULES = [Rule("batchnorm_to_affine", _check, _rewrite, ops=("BatchNormalization",),
              doc="inference mode, constant parameters, float input of known rank")]
