"""A fused convolution's activation as oneDNN post-ops: ``EXACT`` forms agree with ONNX on
NaN / Inf (relu as ``elu`` with alpha 0 ...), ``FAST`` ones differ from it only there (used under
``Config.fast_math`` or a guard that admits them); an activation with neither runs after the
primitive, in place, with torch. ``conv.py`` and ``binary.py`` (per-channel chains) share it.
"""
from __future__ import annotations

from .....ops.fused_cnn import ACTIVATIONS

EXACT = {   # activation -> eltwise post-ops exact on NaN / Inf (params: activation_params)
    "": lambda p: [],
    "relu": lambda p: [("eltwise", "elu", 0.0, 0.0)],
    "sigmoid": lambda p: [("eltwise", "logistic", 0.0, 0.0)],
    "tanh": lambda p: [("eltwise", "tanh", 0.0, 0.0)],
    "swish": lambda p: [("eltwise", "swish", 1.0, 0.0)],
    "hardswish": lambda p: [("eltwise", "hardswish", 1.0 / 6.0, 0.5)],
    "leaky_relu": lambda p: [("eltwise", "relu", float(p[0]), 0.0)] if p and p[0] != 0 else None,
}
FAST = {
    "relu": lambda p: [("eltwise", "relu", 0.0, 0.0)],
    "hardtanh": lambda p: [("eltwise", "clip_v2", float(p[0]), float(p[1]))],
    "gelu": lambda p: [("eltwise", "gelu_erf", 0.0, 0.0)],
    "gelu_tanh": lambda p: [("eltwise", "gelu_tanh", 0.0, 0.0)],
    "hardsigmoid": lambda p: [("eltwise", "hardsigmoid", 1.0 / 6.0, 0.5)],
}


def activation_post_ops(activation: str, params: list[float], exact: bool):
    """(eltwise post-ops, torch op applied after in place or None)."""
    maker = EXACT.get(activation) if exact else (FAST.get(activation) or EXACT.get(activation))
    ops = maker(params) if maker is not None else None
    if ops is not None:
        return ops, None
    return [], activation_after(activation, params)


def activation_after(activation: str, params: list[float]):
    """The activation as a torch op applied to the primitive's output in place."""
    act = ACTIVATIONS[activation]
    return lambda y, _inputs: act(y, params)
