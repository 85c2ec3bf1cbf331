"""Fused convolution in domain ``fusegraph`` (version 1), made by ``passes/fusion/rules_cnn.py``.

``FusedConv(x, w, b?, z?)`` computes ``act(conv(x, w) + b + z)``: the ONNX Conv attributes
(``strides``, ``pads``, ``dilations``, ``group``, ``auto_pad``, ``kernel_shape``), an optional
residual summand ``z`` of the output's shape (added before the activation), and
``activation`` (``ACTIVATIONS``; "" for none) with its ``activation_params`` (leaky_relu:
[alpha]; hardtanh: [min, max]).

Kernels, chosen once at bind time:
- CPU, float32, 2-D conv with static shapes, constant weights and symmetric padding: one
  oneDNN Graph partition (``onednn_graph_cnn.conv_kernel``: compiled once, ~5 us a call
  against ideep's ~20 us of primitive set-up), compiled for the thread count it runs at; an
  activation it does not fuse faithfully (``onednn_graph.POST_OP_IR``) runs after it in
  place. It allocates its output; when malloc does not keep freed memory, outputs of
  ``FRESH_OUT_BYTES`` or more take the ideep kernel below instead (planned buffer).
- Otherwise on CPU (float32, 2-D, static spatial sizes, constant weights): oneDNN through
  ``torch.ops.mkldnn._convolution_pointwise`` (``.binary`` "add" for the residual), with the
  weights reordered once into oneDNN's blocked format for the known input size
  (``prepack.conv_weight``; a loaded artifact provides the blocked form it stored). The
  input is read channels-last (converted inside the kernel when it is not) and the output
  is channels-last. The activations whose oneDNN post-op is not what ONNX computes on NaN
  and +-Inf (``NAN_UNSAFE``: relu and clip give 0 / the bound for NaN, GELU NaN for +inf,
  hardsigmoid 1 for NaN) run after it in place instead. With ``out=`` given and ``z``
  living in ``out`` (the planner's in-place choice), ``_convolution_pointwise_.binary``
  accumulates straight into it. Without a residual the kernel allocates (oneDNN has no
  ``out=`` form). When malloc keeps freed memory (``runtime/host_memory.py``, the default)
  that allocation reuses the previous run's pages; otherwise outputs of ``FRESH_OUT_BYTES``
  or more are zeroed in their planned buffer and accumulated into the same way, since a fresh
  allocation that large comes from the OS as new pages whenever malloc has trimmed its heap
  (shufflenet: 650 page faults, ~20 % of a run). With kept memory the zeroing and the extra
  read of the sum cost more than the allocation (squeezenet 10.4 -> 7.1 ms, inception_v1
  39.5 -> 31.7, fresh processes, 2 threads).
- Otherwise (CUDA, other dtypes, 1-D / 3-D, no mkldnn): ``F.conv*`` then the activation in
  place on the fresh result.
Convolutions under ``PARALLEL_MACS`` multiply-adds (a few us of work) run on one intra-op
thread (``threading_policy.serial``): a fork/join is most of their time (the A/B behind
the threshold: benchmarks/RESULTS.md, "Convolution threading threshold").
Small 1x1 stride-1 convolutions (at most ``GEMM_MACS`` multiply-adds) run instead as one
GEMM on the channels-last data (``addmm`` into the output, with ``out=``) and the activation
in place: oneDNN's fixed cost per call (~30 us) exceeds their arithmetic.

``ChannelShuffle(x)`` is ShuffleNet's ``Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4)
-> Reshape [N, C, H, W]`` in one copy (``torch.native_channel_shuffle``, which keeps
channels-last data channels-last), attribute ``groups``.
No pass logic here; rules decide what fuses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import onednn_graph, prepack
from .activations import gelu
from .conv import ConvGeometry, auto_pads, conv_call, ints_attr, torch_pad_list
from .onednn_graph import POST_OP_IR
from .onednn_graph_cnn import conv_kernel
from .registry import Deferred, FusionKind, NodeContext, register
from .threading_policy import serial, threads_for

DOMAIN = "fusegraph"
CL = torch.channels_last
GEMM_MACS = 8_000_000
PARALLEL_MACS = 1 << 16    # smaller convolutions run on one thread (threading_policy.py)
FRESH_OUT_BYTES = 1 << 20  # larger outputs go into the planned buffer, not a fresh allocation

# activation -> (oneDNN unary attr, algorithm, in-place torch fallback(y, params))
ACTIVATIONS = {
    "": (None, None, lambda y, p: y),
    "relu": ("relu", None, lambda y, p: y.relu_()),
    "sigmoid": ("sigmoid", None, lambda y, p: y.sigmoid_()),
    "tanh": ("tanh", None, lambda y, p: y.tanh_()),
    "hardswish": ("hardswish", None, lambda y, p: F.hardswish(y, inplace=True)),
    "hardsigmoid": ("hardsigmoid", None, lambda y, p: F.hardsigmoid(y, inplace=True)),
    "swish": ("swish", None, lambda y, p: F.silu(y, inplace=True)),
    "leaky_relu": ("leaky_relu", None, lambda y, p: F.leaky_relu_(y, p[0])),
    "hardtanh": ("hardtanh", None, lambda y, p: y.clamp_(p[0], p[1])),
    "gelu": ("gelu", "none", lambda y, p: gelu(y, "none", y)),
    "gelu_tanh": ("gelu", "tanh", lambda y, p: gelu(y, "tanh", y)),
}


# activations whose ideep post-op differs from ONNX on NaN / +inf: applied after the convolution
NAN_UNSAFE = {"relu", "hardtanh", "gelu", "gelu_tanh", "hardsigmoid"}


def _out_dim(size, k: int, s: int, d: int, pb: int, pe: int, auto_pad: str):
    if not isinstance(size, int):
        return None
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return -(-size // s)
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def _infer(ctx: NodeContext):
    xs, ws = ctx.shape(0), ctx.shape(1)
    dtype = ctx.dtype(0) or None
    if xs is None or ws is None:
        return [(dtype, None)]
    n = len(xs) - 2
    k = ints_attr(ctx, "kernel_shape") or list(ws[2:])
    s = ints_attr(ctx, "strides") or [1] * n
    d = ints_attr(ctx, "dilations") or [1] * n
    auto_pad = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    pads = ints_attr(ctx, "pads") if auto_pad in ("NOTSET", "") else None
    pads = pads or [0] * (2 * n)
    spatial = tuple(_out_dim(xs[2 + i], k[i], s[i], d[i], pads[i], pads[n + i], auto_pad) for i in range(n))
    return [(dtype, (xs[0], ws[0]) + spatial)]


def _mkldnn_ok(ctx: NodeContext, w, activation: str) -> bool:
    xs = ctx.shape(0)
    return (ctx.node.outputs[0].layout == "nhwc" and w is not None and w.device.type == "cpu" and w.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and xs is not None and len(xs) == 4
            and all(isinstance(v, int) for v in xs[1:])
            and (ctx.const(2) is None or ctx.const(2).dtype == torch.float32))


@register("FusedConv", domain=DOMAIN, since=1, fusion=FusionKind.OUT_FUSABLE, layout_sensitive=True,
          infer=_infer, writes_out=True, inplace=((3, 0),))
def _fused_conv(ctx: NodeContext):
    activation = str(ctx.attr("activation", ""))
    if activation not in ACTIVATIONS:
        raise ctx.unsupported(f"activation {activation!r} (known: {sorted(ACTIVATIONS)})")
    params = [float(p) for p in ctx.attr("activation_params", [])]
    w = ctx.const(1)
    macs = conv_macs(ctx, w)
    one_thread = macs is not None and w.device.type == "cpu" and macs < PARALLEL_MACS
    if _mkldnn_ok(ctx, w, activation):
        if onednn_graph.AVAILABLE and (ctx.freed_memory_kept or _out_bytes(ctx) < FRESH_OUT_BYTES):
            def build():
                with threads_for(one_thread):   # the partition is compiled for the count it runs at
                    kernel = _graph_kernel(ctx, w, activation, params)
                kernel = kernel or _mkldnn_kernel(ctx, w, activation, params)
                return serial(kernel) if one_thread else kernel
            return Deferred(_channels_last_input(_fallback_kernel(ctx, activation, params)), build)
        kernel = _mkldnn_kernel(ctx, w, activation, params)
    else:
        kernel = _fallback_kernel(ctx, activation, params)
    return serial(kernel) if one_thread else kernel


def _channels_last_input(kernel):
    """``kernel`` on a channels-last copy of its first input (the layout the oneDNN kernels read)."""
    def plain(x, *args, **kwargs):
        return kernel(x.contiguous(memory_format=CL), *args, **kwargs)
    plain.writes_out = False
    return plain


def conv2d_geometry(ctx: NodeContext, w: torch.Tensor):
    """(strides, begin pads, end pads, dilations, group) of a 2-D FusedConv of static input
    spatial size."""
    xs = tuple(ctx.shape(0))
    geo = ConvGeometry(ctx)
    k = geo.kernel_shape or list(w.shape[2:])
    s, d = geo.strides or [1, 1], geo.dilations or [1, 1]
    begin, end = auto_pads(geo.auto_pad, list(xs[2:]), [(k[i] - 1) * d[i] + 1 for i in range(2)], s, geo.pads)
    return list(s), list(begin), list(end), list(d), geo.group


def _graph_kernel(ctx: NodeContext, w: torch.Tensor, activation: str, params: list[float]):
    """The oneDNN Graph kernel (``onednn_graph_cnn.conv_kernel``), or None when it declines."""
    s, begin, end, d, group = conv2d_geometry(ctx, w)
    b = ctx.const(2)
    if begin != end or min(begin) < 0 or (ctx.has_input(2) and b is None):
        return None
    fused = activation if activation in POST_OP_IR else ""
    got = conv_kernel(ctx.name, tuple(ctx.shape(0)), ctx.node.outputs[0].shape, w, b, s, begin, d, group,
                      ctx.has_input(3), fused, params)
    if isinstance(got, str):
        return None
    return got if fused == activation else _then(got, ACTIVATIONS[activation][2], params)


def _then(kernel, act, params):
    """``kernel`` followed by ``act`` in place on its (fresh or planned) result."""
    def conv_act(*args, **kwargs):
        return act(kernel(*args, **kwargs), params)
    conv_act.__qualname__ = f"{kernel.__qualname__}.then_activation"
    conv_act.writes_out = getattr(kernel, "writes_out", True)
    conv_act.onednn_graph = getattr(kernel, "onednn_graph", None)
    return conv_act


def conv_macs(ctx: NodeContext, w) -> int | None:
    """Multiply-adds of one call (static output shape and constant weights), else None."""
    ys = ctx.node.outputs[0].shape
    if w is None or ys is None or not all(isinstance(d, int) for d in ys):
        return None
    n = 1
    for d in tuple(ys) + tuple(w.shape[1:]):
        n *= d
    return n


def _fallback_kernel(ctx: NodeContext, activation: str, params: list[float]):
    geo = ConvGeometry(ctx)
    act = ACTIVATIONS[activation][2]
    g = geo.group

    def kernel(x, w, b=None, z=None):
        s, d, begin, end = geo.resolve(tuple(x.shape[2:]), tuple(w.shape[2:]))
        y = conv_call(x, w, b, s, d, g, begin, end)
        if z is not None:
            y = y.add_(z)
        return act(y, params)
    kernel.writes_out = False
    return kernel


def _mkldnn_kernel(ctx: NodeContext, w: torch.Tensor, activation: str, params: list[float]):
    if activation in NAN_UNSAFE:       # the convolution alone, the activation after it
        return _then(_mkldnn_kernel(ctx, w, "", params), ACTIVATIONS[activation][2], params)
    xs = tuple(ctx.shape(0))
    geo = ConvGeometry(ctx)
    g = geo.group
    k = geo.kernel_shape or list(w.shape[2:])
    s = geo.strides or [1, 1]
    d = geo.dilations or [1, 1]
    begin, end = auto_pads(geo.auto_pad, list(xs[2:]), [(k[i] - 1) * d[i] + 1 for i in range(2)], s, geo.pads)
    pre_pad = None
    if begin != end or min(begin) < 0:
        pre_pad, padding = torch_pad_list(begin, end), [0, 0]
        sizes = [xs[2 + i] + begin[i] + end[i] for i in range(2)]
    else:
        padding, sizes = list(begin), list(xs[2:])
    batch = xs[0] if isinstance(xs[0], int) else 1
    b = ctx.const(2)
    bias = None if b is None else b.contiguous()
    if not ctx.has_input(3) and _gemm_ok(xs, w, s, d, g, begin, end):   # before prepacking: GEMM needs none
        return _gemm_kernel(w, bias, ACTIVATIONS[activation][2], params)
    packed = prepack.conv_weight(ctx.node.inputs[1].name, w, padding, list(s), list(d), g,
                                 [batch, xs[1]] + sizes)   # or the artifact's stored form
    attr, algorithm, _ = ACTIVATIONS[activation]
    scalars = list(params) if attr in ("leaky_relu", "hardtanh") else []
    stride, dil = list(s), list(d)

    binary = torch.ops.mkldnn._convolution_pointwise.binary
    binary_ = torch.ops.mkldnn._convolution_pointwise_.binary
    if not ctx.has_input(3):
        unary = torch.ops.mkldnn._convolution_pointwise.default
        uattr = attr or "none"

        def conv(x, w=None, b=None):
            x = x.contiguous(memory_format=CL)
            if pre_pad is not None:
                x = F.pad(x, pre_pad).contiguous(memory_format=CL)
            return unary(x, packed, bias, padding, stride, dil, g, uattr, scalars, algorithm)
        if _out_bytes(ctx) < FRESH_OUT_BYTES or ctx.freed_memory_kept:
            conv.writes_out = False
            return conv

        def conv_into(x, w=None, b=None, out=None):
            if out is None or not out.is_contiguous(memory_format=CL):
                return _copy_into(conv(x), out)
            x = x.contiguous(memory_format=CL)
            if pre_pad is not None:
                x = F.pad(x, pre_pad).contiguous(memory_format=CL)
            out.zero_()    # act(conv + b + 0) == act(conv + b): the sum post-op writes in place
            binary_(out, x, packed, bias, padding, stride, dil, g, "add", None, attr, scalars, algorithm)
            return out
        return conv_into

    def conv_add(x, w, b, z, out=None):
        x = x.contiguous(memory_format=CL)
        if pre_pad is not None:
            x = F.pad(x, pre_pad).contiguous(memory_format=CL)
        if out is None:
            return binary(x, z, packed, bias, padding, stride, dil, g, "add", None, attr, scalars, algorithm)
        if out.data_ptr() != z.data_ptr() or out.stride() != z.stride():
            out.copy_(z)
        binary_(out, x, packed, bias, padding, stride, dil, g, "add", None, attr, scalars, algorithm)
        return out
    return conv_add


def _out_bytes(ctx: NodeContext) -> int:
    ys = ctx.node.outputs[0].shape
    n = ctx.node.outputs[0].dtype.itemsize
    for d in ys or ():
        n *= d if isinstance(d, int) else 0
    return n


def _copy_into(y, out):
    if out is None:
        return y
    out.copy_(y)
    return out


def _gemm_ok(xs, w, s, d, g, begin, end) -> bool:
    n, c, h, wd = xs
    return (tuple(w.shape[2:]) == (1, 1) and list(s) == [1, 1] and g == 1 and not any(begin) and not any(end)
            and isinstance(n, int) and n * h * wd * c * w.shape[0] <= GEMM_MACS)


def _gemm_kernel(w: torch.Tensor, bias, act, params):
    k, c = w.shape[0], w.shape[1]
    wt = w.reshape(k, c).t().contiguous()

    def conv1x1(x, w=None, b=None, out=None):
        n, _, h, wd = x.shape
        x2 = x.contiguous(memory_format=CL).permute(0, 2, 3, 1).reshape(n * h * wd, c)
        y = out if out is not None and out.is_contiguous(memory_format=CL) else \
            torch.empty((n, k, h, wd), dtype=x.dtype, device=x.device, memory_format=CL)
        y2 = y.permute(0, 2, 3, 1).view(n * h * wd, k)
        if bias is None:
            torch.mm(x2, wt, out=y2)
        else:
            torch.addmm(bias, x2, wt, out=y2)
        act(y, params)
        if out is not None and y is not out:
            out.copy_(y)
            return out
        return y
    return conv1x1


# ---------------------------------------------------------------- ChannelShuffle

@register("ChannelShuffle", domain=DOMAIN, since=1, fusion=FusionKind.INJECTIVE,
          infer=lambda ctx: [(ctx.dtype(0) or None, ctx.shape(0))])
def _channel_shuffle(ctx: NodeContext):
    g = int(ctx.attr("groups"))
    return lambda x: torch.native_channel_shuffle(x, g)   # ATen's kernel, channels-last aware
