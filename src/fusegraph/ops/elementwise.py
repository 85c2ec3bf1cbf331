"""Elementwise and broadcast arithmetic: Add, Sub, Mul, Div, and the common unary math ops.

Each kernel is a torch call; attributes are read once at build time.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .common import broadcast_of_inputs, same_as_input
from .registry import FusionKind, NodeContext, register

_BCAST = broadcast_of_inputs()


def _binary(op_type: str, fn, since: int = 7):
    @register(op_type, since=since, fusion=FusionKind.BROADCAST, infer=_BCAST)
    def build(ctx: NodeContext, _fn=fn):
        return _fn
    return build


_binary("Add", torch.add)
_binary("Sub", torch.sub)
_binary("Mul", torch.mul)


@register("Div", since=7, fusion=FusionKind.BROADCAST, infer=_BCAST)
def _div(ctx: NodeContext):
    if ctx.dtype(0).is_integer:
        return lambda a, b: torch.div(a, b, rounding_mode="trunc")
    return torch.div


_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal, "Floor": torch.floor, "Ceil": torch.ceil, "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid, "Relu": torch.relu, "Erf": torch.erf, "Sin": torch.sin, "Cos": torch.cos,
}

for _op, _fn in _UNARY.items():
    register(_op, since=6, fusion=FusionKind.ELEMENTWISE, infer=same_as_input(0))(
        lambda ctx, _fn=_fn: _fn)
