"""The CPU backend's kernels for ``fusegraph::FusedConv`` (``ops/fused_cnn.py`` holds the op,
its semantics and its portable ATen kernel).

Chosen once at bind time, for a float32 or bfloat16 (``ONEDNN_TYPES``) 2-D convolution with
static shapes, constant weights and an ``nhwc`` output (the layout pass's choice):
- float32: one oneDNN Graph partition (``onednn_graph_cnn.conv_kernel``: compiled once, ~5 us a call
  against ideep's ~20 us of primitive set-up), compiled for the thread count it runs at, behind
  a ``Deferred`` (a node that ends inside a script segment never compiles one); an activation
  it does not fuse faithfully (``onednn_graph.POST_OP_IR``) runs after it in place. It
  allocates its output; when malloc does not keep freed memory, outputs of
  ``FRESH_OUT_BYTES`` or more take the ideep kernel below instead (planned buffer);
- otherwise (and bfloat16: AMX) oneDNN through ``torch.ops.mkldnn._convolution_pointwise`` (``.binary`` "add" for
  the residual), the weights reordered once into oneDNN's blocked format for the known input
  size (``prepack.conv_weight``; a loaded artifact provides the blocked form it stored). The
  input is read channels-last and the output is channels-last. The activations whose oneDNN
  post-op is not what ONNX computes on NaN and +-Inf (``NAN_UNSAFE``) run after it in place.
  With ``out=`` given and ``z`` living in ``out`` (the planner's in-place choice),
  ``_convolution_pointwise_.binary`` accumulates straight into it; without a residual and with
  malloc not keeping freed memory, outputs of ``FRESH_OUT_BYTES`` or more are zeroed in their
  planned buffer and accumulated into the same way (a fresh allocation that large comes from
  the OS as new pages whenever malloc has trimmed its heap);
- small 1x1 stride-1 convolutions (at most ``GEMM_MACS`` multiply-adds) run as one GEMM on the
  channels-last data (``addmm`` into the output, with ``out=``), the activation in place:
  oneDNN's fixed cost per call (~30 us) exceeds their arithmetic.
A float16 convolution runs the same kernels in float32 over a float32 copy of its weights, its
input upcast and its result rounded to float16 once (``FP16_COMPUTE``, ``_fp16_storage_kernel``).
Anything else declines (the op's portable kernel: ``F.conv*``, then the activation).
Convolutions under ``PARALLEL_MACS`` multiply-adds run on one intra-op thread
(``threading_policy.serial``; benchmarks/RESULTS.md, "Convolution threading threshold").
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ....ops.conv import ConvGeometry, auto_pads, torch_pad_list
from ....ops.fused_cnn import ACTIVATIONS, conv_macs, portable_kernel
from ..protocol import Decline, Deferred
from . import onednn_graph, prepack
from .onednn_graph import post_ops
from .onednn_graph_cnn import conv_kernel as graph_conv_kernel
from .threading_policy import PARALLEL_MACS, serial, threads_for

CL = torch.channels_last
# data types oneDNN's convolutions run here: float32, and bfloat16 on AMX / AVX512-BF16
ONEDNN_TYPES = (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)
GEMM_MACS = 8_000_000
FRESH_OUT_BYTES = 1 << 20  # larger outputs go into the planned buffer, not a fresh allocation

# activation -> (oneDNN unary attr, algorithm) of ideep's post-op
ONEDNN_UNARY = {
    "": (None, None), "relu": ("relu", None), "sigmoid": ("sigmoid", None), "tanh": ("tanh", None),
    "hardswish": ("hardswish", None), "hardsigmoid": ("hardsigmoid", None), "swish": ("swish", None),
    "leaky_relu": ("leaky_relu", None), "hardtanh": ("hardtanh", None), "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
}
# activations whose ideep post-op differs from ONNX on NaN / +inf: applied after the convolution
NAN_UNSAFE = {"relu", "hardtanh", "gelu", "gelu_tanh", "hardsigmoid"}


def _mkldnn_ok(ctx, w, types=ONEDNN_TYPES) -> bool:
    xs = ctx.shape(0)
    return (ctx.node.outputs[0].layout == "nhwc" and w is not None and w.device.type == "cpu"
            and w.dtype in types and ctx.dtype(0) is not None and ctx.dtype(0).to_torch() == w.dtype
            and torch.backends.mkldnn.is_available() and xs is not None and len(xs) == 4
            and all(isinstance(v, int) for v in xs[1:])
            and (ctx.const(2) is None or ctx.const(2).dtype == w.dtype))


def fused_conv_kernel(ctx, opdef, provided: dict, exact: bool = True):
    """The CPU kernel of one FusedConv node, or a ``Decline``; ``provided``: the packed weight
    forms a loaded artifact carries (``prepack.conv_weight``); ``exact``: NaN / Inf as ONNX
    says (False, ``Config.fast_math``: oneDNN fuses every activation)."""
    activation = str(ctx.attr("activation", ""))
    if activation not in ACTIVATIONS:
        return opdef.build(ctx)      # the op refuses it with its own typed error
    params = [float(p) for p in ctx.attr("activation_params", [])]
    w = ctx.const(1)
    macs = conv_macs(ctx, w)
    one_thread = macs is not None and w.device.type == "cpu" and macs < PARALLEL_MACS
    if w is not None and w.dtype == torch.float16 and FP16_COMPUTE == "fp32":
        return _fp16_storage_kernel(ctx, w, activation, params, provided, exact, one_thread)
    if not _mkldnn_ok(ctx, w):
        if w is None or w.device.type != "cpu":
            return Decline("weights are not a constant CPU tensor", "onednn")
        return Decline("needs a float32 or bfloat16 4-D nhwc convolution with static shapes", "onednn")
    return _onednn_kernel(ctx, w, ctx.const(2), activation, params, provided, exact, one_thread)


def _onednn_kernel(ctx, w, b, activation, params, provided, exact, one_thread):
    """The oneDNN Graph partition (behind a ``Deferred``) or ideep kernel for weight ``w`` and bias ``b``."""
    if onednn_graph.AVAILABLE and w.dtype == torch.float32 and (ctx.freed_memory_kept or _out_bytes(ctx) < FRESH_OUT_BYTES):
        def build():
            with threads_for(one_thread):   # the partition is compiled for the count it runs at
                kernel = _graph_kernel(ctx, w, b, activation, params, exact)
            kernel = kernel or _mkldnn_kernel(ctx, w, b, activation, params, provided, exact)
            return serial(kernel) if one_thread else kernel
        plain = portable_kernel(ctx, activation, params)
        return Deferred(_channels_last_input(lambda x, _w=None, _b=None, *z: plain(x, w, b, *z)), build)
    kernel = _mkldnn_kernel(ctx, w, b, activation, params, provided, exact)
    return serial(kernel) if one_thread else kernel


# float16 convolutions compute in float32 over float16 storage (no AMX-FP16 here): resnet50 fp16-native
# 93 ms, fp32-compute 61 ms, fp32 48 ms at 2 threads (benchmarks/RESULTS.md, "fp16 on CPU")
FP16_COMPUTE = "fp32"      # "fp16": decline to the op's portable float16 kernel (ATen -> oneDNN fp16)
_twins: dict[int, tuple] = {}    # id(fp16 weight) -> (weakref(it), its float32 copy)


def fp32_twin(w: torch.Tensor) -> torch.Tensor:
    """The float32 copy of float16 constant ``w``, made once and kept while ``w`` lives
    (``CpuBackend.export_state`` finds its packed forms through it)."""
    key = id(w)
    got = _twins.get(key)
    if got is None or got[0]() is not w:
        got = _twins[key] = (weakref.ref(w, lambda _: _twins.pop(key, None)), w.float().contiguous())
    return got[1]


def twin_of(w: torch.Tensor) -> torch.Tensor | None:
    """``fp32_twin(w)`` when it was made, else None."""
    got = _twins.get(id(w))
    return got[1] if got is not None and got[0]() is w else None


def _fp16_storage_kernel(ctx, w16, activation, params, provided, exact, one_thread):
    """float16 in and out, float32 inside: the float32 oneDNN kernel over the weight's float32
    copy (made once), the input (and residual) upcast per call, the result rounded to float16
    once; exactly the float16 rounding of the float32-accumulated ``act(conv + b + z)``."""
    if not _mkldnn_ok(ctx, w16, (torch.float16,)):
        return Decline("needs a float16 4-D nhwc convolution with static shapes", "onednn")
    b16 = ctx.const(2)
    b = None if b16 is None else b16.float()
    inner = _onednn_kernel(ctx, fp32_twin(w16), b, activation, params, provided, exact, one_thread)
    return fp16_io(inner, ctx.has_input(3))


def fp16_io(inner, residual: bool = False):
    """``inner`` (a float32 kernel of a convolution or product, or a ``Deferred`` of one) over
    float16 inputs (``residual``: and a float16 ``z``) and a float16 output, rounded once."""
    def wrap(kernel):
        def fp16_storage(x, w=None, b=None, z=None, out=None):
            y = kernel(x.float(), None, None, z.float()) if residual else kernel(x.float())
            if out is None:
                return y.to(torch.float16)
            out.copy_(y)
            return out
        fp16_storage.fp16_compute = "fp32"
        fp16_storage.onednn_graph = getattr(kernel, "onednn_graph", None)
        return fp16_storage
    if isinstance(inner, Deferred):
        deferred = Deferred(wrap(inner.plain), lambda: wrap(inner.resolve()))
        deferred.fp16_compute = "fp32"
        return deferred
    return wrap(inner)


def _channels_last_input(kernel):
    """``kernel`` on a channels-last copy of its first input (the layout the oneDNN kernels read)."""
    def plain(x, *args, **kwargs):
        return kernel(x.contiguous(memory_format=CL), *args, **kwargs)
    plain.writes_out = False
    return plain


def conv2d_geometry(ctx, w: torch.Tensor):
    """(strides, begin pads, end pads, dilations, group) of a 2-D FusedConv of static input
    spatial size."""
    xs = tuple(ctx.shape(0))
    geo = ConvGeometry(ctx)
    k = geo.kernel_shape or list(w.shape[2:])
    s, d = geo.strides or [1, 1], geo.dilations or [1, 1]
    begin, end = auto_pads(geo.auto_pad, list(xs[2:]), [(k[i] - 1) * d[i] + 1 for i in range(2)], s, geo.pads)
    return list(s), list(begin), list(end), list(d), geo.group


def _graph_kernel(ctx, w: torch.Tensor, b, activation: str, params: list[float], exact: bool = True):
    """The oneDNN Graph kernel (``onednn_graph_cnn.conv_kernel``), or None when it declines."""
    s, begin, end, d, group = conv2d_geometry(ctx, w)
    if begin != end or min(begin) < 0 or (ctx.has_input(2) and b is None):
        return None
    fused = activation if activation in post_ops(exact) else ""
    got = graph_conv_kernel(ctx.name, tuple(ctx.shape(0)), ctx.node.outputs[0].shape, w, b, s, begin, d, group,
                            ctx.has_input(3), fused, params, exact)
    if isinstance(got, str):
        return None
    return got if fused == activation else _then(got, ACTIVATIONS[activation], params)


def _then(kernel, act, params):
    """``kernel`` followed by ``act`` in place on its (fresh or planned) result."""
    def conv_act(*args, **kwargs):
        return act(kernel(*args, **kwargs), params)
    conv_act.__qualname__ = f"{kernel.__qualname__}.then_activation"
    conv_act.writes_out = getattr(kernel, "writes_out", True)
    conv_act.onednn_graph = getattr(kernel, "onednn_graph", None)
    return conv_act


def _mkldnn_kernel(ctx, w: torch.Tensor, b, activation: str, params: list[float], provided: dict,
                   exact: bool = True):
    if exact and activation in NAN_UNSAFE:       # the convolution alone, the activation after it
        return _then(_mkldnn_kernel(ctx, w, b, "", params, provided), ACTIVATIONS[activation], params)
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
    bias = None if b is None else b.contiguous()
    if not ctx.has_input(3) and _gemm_ok(xs, w, s, d, g, begin, end):   # before prepacking: GEMM needs none
        return _gemm_kernel(w, bias, ACTIVATIONS[activation], params)
    packed = prepack.conv_weight(ctx.node.inputs[1].name, w, padding, list(s), list(d), g,
                                 [batch, xs[1]] + sizes, provided)   # or the artifact's stored form
    attr, algorithm = ONEDNN_UNARY[activation]
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


def _out_bytes(ctx) -> int:
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
