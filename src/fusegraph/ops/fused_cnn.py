"""Fused convolution in domain ``fusegraph`` (version 1), made by ``passes/fusion/rules_cnn.py``.

``FusedConv(x, w, b?, z?)`` computes ``act(conv(x, w) + b + z)``: the ONNX Conv attributes
(``strides``, ``pads``, ``dilations``, ``group``, ``auto_pad``, ``kernel_shape``), an optional
residual summand ``z`` of the output's shape (added before the activation), and
``activation`` (``ACTIVATIONS``; "" for none) with its ``activation_params`` (leaky_relu:
[alpha]; hardtanh: [min, max]).

The op's own kernel is portable ATen: ``F.conv*``, the residual added, then the activation in
place on the fresh result (every device, every dtype). The CPU backend's oneDNN kernels for it
live in ``runtime/backends/cpu/dnnl/conv.py``.

``ChannelShuffle(x)`` is ShuffleNet's ``Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4)
-> Reshape [N, C, H, W]`` in one copy (``torch.native_channel_shuffle``, which keeps
channels-last data channels-last; with ``out=``, one strided copy into the planned buffer
in whatever layout it has), attribute ``groups``.
No pass logic here; rules decide what fuses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .activations import gelu
from .common import bias_like, product_out_dtype, widened, widens
from .conv import conv_call, conv_infer, ConvGeometry
from .precision_reasons import CONVOLUTION
from .registry import FusionKind, Movement, NodeContext, register
from .value_range import ProductRange

DOMAIN = "fusegraph"

# activation -> its in-place torch form (y, params) -> y
ACTIVATIONS = {
    "": lambda y, p: y,
    "relu": lambda y, p: y.relu_(),
    "sigmoid": lambda y, p: y.sigmoid_(),
    "tanh": lambda y, p: y.tanh_(),
    "hardswish": lambda y, p: F.hardswish(y, inplace=True),
    "hardsigmoid": lambda y, p: F.hardsigmoid(y, inplace=True),
    "swish": lambda y, p: F.silu(y, inplace=True),
    "leaky_relu": lambda y, p: F.leaky_relu_(y, p[0]),
    "hardtanh": lambda y, p: y.clamp_(p[0], p[1]),
    "gelu": lambda y, p: gelu(y, "none", y),
    "gelu_tanh": lambda y, p: gelu(y, "tanh", y),
}


def _fused_conv_infer(ctx: NodeContext):
    """``conv_infer``, with the output type of an ``out_dtype`` attribute (a float32 output
    folded in from a Cast, ``passes/fold_casts.py``)."""
    shape = conv_infer(ctx)[0][1]
    zs = ctx.shape(3) if ctx.n_inputs > 3 and ctx.node.inputs[3] is not None else None
    if zs is not None and shape is not None and len(zs) == len(shape) and any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(zs, shape)):
        raise ValueError(f"residual of shape {tuple(zs)} for an output of shape {tuple(shape)}")
    return [(product_out_dtype(ctx), shape)]


def conv_terms(node) -> int | None:
    """The terms each output of a convolution sums: its weight's [C/group, kh, kw, ...]."""
    w = node.inputs[1].shape if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if w is None or not all(isinstance(d, int) for d in w):
        return None
    n = 1
    for d in w[1:]:
        n *= int(d)
    return n


@register("FusedConv", domain=DOMAIN, since=1, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True,
          infer=_fused_conv_infer, writes_out=True, inplace=((3, 0),), precision=CONVOLUTION,
          value_range=ProductRange(conv_terms))
def _fused_conv(ctx: NodeContext):
    activation = str(ctx.attr("activation", ""))
    if activation not in ACTIVATIONS:
        raise ctx.unsupported(f"activation {activation!r} (known: {sorted(ACTIVATIONS)})")
    params = [float(p) for p in ctx.attr("activation_params", [])]
    return portable_kernel(ctx, activation, params)


def conv_macs(ctx: NodeContext, w) -> int | None:
    """Multiply-adds of one call (static output shape and constant weights), else None."""
    ys = ctx.node.outputs[0].shape
    if w is None or ys is None or not all(isinstance(d, int) for d in ys):
        return None
    n = 1
    for d in tuple(ys) + tuple(w.shape[1:]):
        n *= d
    return n


def portable_kernel(ctx: NodeContext, activation: str, params: list[float]):
    """``act(conv(x, w) + b + z)`` through ATen, the activation in place on the fresh result."""
    geo = ConvGeometry(ctx)
    act = ACTIVATIONS[activation]
    g = geo.group
    widen = widens(ctx)

    def kernel(x, w, b=None, z=None):
        if widen:
            x, w, b, z = widened(x, w, b, z)
        b = bias_like(b, x)
        s, d, begin, end = geo.resolve(tuple(x.shape[2:]), tuple(w.shape[2:]))
        y = conv_call(x, w, b, s, d, g, begin, end)
        if z is not None:
            y = y.add_(z)
        return act(y, params)
    kernel.writes_out = False
    return kernel


# ---------------------------------------------------------------- ChannelShuffle

@register("ChannelShuffle", domain=DOMAIN, since=1, fusion=FusionKind.INJECTIVE,
          infer=lambda ctx: [(ctx.dtype(0) or None, ctx.shape(0))], writes_out=True, movement=Movement.PERMUTE)
def _channel_shuffle(ctx: NodeContext):
    g = int(ctx.attr("groups"))

    def shuffle(x, out=None):
        if out is None:
            return torch.native_channel_shuffle(x, g)   # ATen's kernel, channels-last aware
        c = x.shape[1]                                  # output channel j * g + i <- input i * (C/g) + j
        out.unflatten(1, (c // g, g)).copy_(x.unflatten(1, (g, c // g)).transpose(1, 2))
        return out
    return shuffle
