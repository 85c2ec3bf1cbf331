"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to 2-D at ``axis`` (dims [0:axis] and [axis:] flattened,
default axis 1) and the op runs along the second dim; from 13 on it runs along one axis
(default -1). Output shape and dtype are the input's. Softmax and LogSoftmax write into
``out=`` through ``torch._softmax`` / ``torch._log_softmax`` (what ``torch.softmax`` calls).
"""
from __future__ import annotations

import torch

from ..ir import DType
from .common import normalize_axis, same_as_input
from .precision_reasons import EXPONENTIALS_AND_SUM
from .registry import FusionKind, NodeContext, Precision, no_out, register
from .value_range import Fact

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16)


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.numel() == 0:
        return x.clone()
    idx = torch.argmax(x, dim, keepdim=True)
    return torch.zeros_like(x).scatter_(dim, idx, 1)


def _softmax(x, d, out=None):
    return torch.softmax(x, d) if out is None else torch._softmax(x, d, False, out=out)


def _log_softmax(x, d, out=None):
    return torch.log_softmax(x, d) if out is None else torch._log_softmax(x, d, False, out=out)


_FNS = {
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "Hardmax": _hardmax,
}


def softmax_range(node, ins: list[Fact]) -> list[Fact]:
    """Probabilities: within [0, 1], NaN where a row holds NaN or inf (unless the op's
    ``nan_to_zero`` maps such rows to 0)."""
    nan = any(f.nan or f.inf for f in ins) and not node.attrs.get("nan_to_zero", 0)
    return [Fact(1.0, nan)]


_FACTS = {
    "Softmax": {"precision": EXPONENTIALS_AND_SUM, "value_range": softmax_range},
    "LogSoftmax": {"precision": (Precision.KEEP, "exponentials, a sum and a log: float32")},
}


def _make(op_type: str):
    fn = _FNS[op_type]
    writes_out = op_type != "Hardmax"

    @register(op_type, since=1, fusion=FusionKind.OPAQUE, infer=same_as_input(0), writes_out=writes_out,
              **_FACTS.get(op_type, {}))
    def build(ctx: NodeContext):
        if ctx.dtype(0) not in _FLOATS:
            raise ctx.unsupported(f"input dtype {ctx.dtype(0).name}")
        if ctx.version >= 13:
            axis = int(ctx.attr("axis", -1))
            if not writes_out:
                return lambda x: fn(x, normalize_axis(axis, x.dim()))

            def kernel(x, out=None):
                return fn(x, normalize_axis(axis, x.dim()), out=out)
            return kernel

        axis = int(ctx.attr("axis", 1))

        def coerced(x, out=None):
            ax = normalize_axis(axis, x.dim()) if x.dim() else 0
            inner = 1
            for d in x.shape[ax:]:
                inner *= d
            flat = x.reshape(*x.shape[:ax], inner)
            if out is not None:
                fn(flat, ax, out=out.view(flat.shape))
                return out
            return fn(flat, ax).reshape(x.shape)
        return coerced if writes_out else no_out(coerced)
    return build


for _op in _FNS:
    _make(_op)
