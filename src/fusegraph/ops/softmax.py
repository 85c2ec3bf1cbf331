"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to 2-D at ``axis`` (dims [0:axis] and [axis:] flattened,
default axis 1) and the op runs along the second dim; from 13 on it runs along one axis
(default -1). Output shape and dtype are the input's.
"""
from __future__ import annotations

import torch

from ..ir import DType
from .common import normalize_axis, same_as_input
from .registry import FusionKind, NodeContext, register

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16)


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.numel() == 0:
        return x.clone()
    idx = torch.argmax(x, dim, keepdim=True)
    return torch.zeros_like(x).scatter_(dim, idx, 1)


_FNS = {
    "Softmax": lambda x, d: torch.softmax(x, d),
    "LogSoftmax": lambda x, d: torch.log_softmax(x, d),
    "Hardmax": _hardmax,
}


def _make(op_type: str):
    fn = _FNS[op_type]

    @register(op_type, since=1, fusion=FusionKind.OPAQUE, infer=same_as_input(0))
    def build(ctx: NodeContext):
        if ctx.dtype(0) not in _FLOATS:
            raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
        if ctx.version >= 13:
            axis = int(ctx.attr("axis", -1))

            def kernel(x):
                return fn(x, normalize_axis(axis, x.dim()))
            return kernel

        axis = int(ctx.attr("axis", 1))

        def coerced(x):
            ax = normalize_axis(axis, x.dim()) if x.dim() else 0
            inner = 1
            for d in x.shape[ax:]:
                inner *= d
            flat = x.reshape(*x.shape[:ax], inner)
            return fn(flat, ax).reshape(x.shape)
        return coerced
    return build


for _op in _FNS:
    _make(_op)
