"""``fusegraph::FusedConv`` as one oneDNN convolution primitive: ``act(conv(x, w) + b + z)``.

Made at bind time for a 2-D float32 / bfloat16 convolution with static shapes and constant
weights (any group count: depthwise included), reading its input and writing its output in
the layout the layout pass chose for the output: channels-last in conv nets (brgemm
kernels; a graph input in NCHW is copied into a staging buffer, oneDNN has no fast
NCHW-to-NHWC convolution here), NCHW in graphs the pass left alone (oneDNN's GEMM kernels). A float16 convolution
(no float16 arithmetic on this CPU) is the float32 primitive over float16 storage: its input
converted in the staging buffer, its result rounded once into the float16 output. The
weights are reordered once into the blocked layout the primitive picks (``weights.py``) and
are not read from the graph at run time (``DnnlKernel.reads``: the input, and the residual).
A bfloat16 convolution whose node has a float32 output (``out_dtype``: a Cast folded in,
``passes/fold_casts.py``) writes float32, the accumulations unrounded (without a residual).

Post-ops, in order:
- the bias of a bfloat16 depthwise convolution, as a ``binary add`` of one float32 per channel
  (``_depthwise_bias_post_op``: this oneDNN offers its brgemm depthwise kernel, ``brdgmm``,
  for bfloat16 only without a float32 bias argument; any other convolution takes its bias as
  the primitive's argument);
- the residual ``z``: a ``sum`` post-op when the planner put the output in place over ``z``
  (``ctx.inplace_input == 3``: the convolution accumulates onto it), else a ``binary add``
  reading ``z``;
- the activation, as the oneDNN eltwise that computes what ONNX says on NaN and +-Inf
  (``activation_post_ops.EXACT``: relu is ``elu`` with alpha 0, which keeps NaN, where oneDNN's relu maps NaN to
  0); activations without one (clip, GELU, hard sigmoid) run after the primitive in place
  with torch (``AFTER``), unless ``exact`` is off (``Config.fast_math``): then every
  activation is a post-op (``activation_post_ops.FAST``).
A convolution oneDNN runs on its im2col + GEMM fallback (``x64:gemm:jit``) carries the reason
in ``slow`` (NCHW data, or a geometry without jit / brgemm kernels), which the backend reports
beside the declines. Convolutions under ``PARALLEL_MACS`` multiply-adds are made for one thread (oneDNN fixes the
thread count of its partition when the primitive is made). Anything else declines with a
reason: the CPU backend's other kernels take the node.

A strided bfloat16 convolution on oneDNN's AMX brgemm kernel is run once when it is made, on
a fixed random input, and compared with ATen's float32 arithmetic on the same values
(``_checked_error``): this oneDNN miscomputes some of those geometries (a 2x2 kernel at
stride 2 over 80 channels), and a kernel that does declines, naming the check.
"""
from __future__ import annotations

import torch

from .....ops.conv import ConvGeometry
from .....ops.fused_cnn import ACTIVATIONS, conv_macs
from ...protocol import Decline
from ..threading_policy import PARALLEL_MACS, threads_for
from . import capi
from .activation_post_ops import activation_after, activation_post_ops
from .call import DnnlKernel, Slot
from .capi import Dims
from .compute import compute_dtype
from .layouts import channels_last, contiguous, dtype_of, static_shape, strides_of
from .memory import DTYPES, MemDesc, Memory
from .primitive import Attr, create, exact_post_ops

TYPES = (torch.float32, torch.bfloat16, torch.float16)


def _single_pixel(shape) -> bool:
    return all(d == 1 for d in shape[2:])


def _image_md(shape, strides, dtype) -> MemDesc:
    """The 4-D oneDNN description of an activation: a 3-D ``[N, C, L]`` tensor as ``[N, C, 1, L]``
    (the height's stride follows the layout: channels-last stays channels-last)."""
    if len(shape) == 3:
        n, c, length = shape
        sn, sc, sl = strides
        shape, strides = (n, c, 1, length), (sn, sc, sl * length, sl)
    return MemDesc.of(shape, dtype, strides)


def conv_kernel(ctx, store, resources, exact: bool = True):
    """The oneDNN kernel of one FusedConv node, or a ``Decline`` saying why not."""
    node = ctx.node
    activation = str(ctx.attr("activation", ""))
    if activation not in ACTIVATIONS:
        return Decline(f"activation {activation!r} is not a known FusedConv activation", "dnnl")
    params = [float(p) for p in ctx.attr("activation_params", [])]
    w, b = ctx.const(1), ctx.const(2)
    x_v, y_v = node.inputs[0], node.outputs[0]
    z_v = node.inputs[3] if len(node.inputs) > 3 else None
    xs, ys = static_shape(x_v), static_shape(y_v)
    if w is None or w.device.type not in ("cpu", "meta") or (ctx.has_input(2) and b is None):
        return Decline("weights or bias are not constant CPU tensors", "dnnl")
    if xs is None or ys is None or len(xs) not in (3, 4) or w.dim() != len(xs):
        return Decline("needs a 1-D or 2-D convolution with static shapes (3-D: oneDNN has no "
                       "channels-last kernels this backend describes)", "dnnl")
    dtype = dtype_of(x_v)
    y_dtype = y_v.dtype.to_torch()
    widened = (dtype, y_dtype) == (torch.bfloat16, torch.float32)    # ``out_dtype``: a Cast folded in
    if dtype not in TYPES or w.dtype != dtype or (y_dtype != dtype and not widened):
        return Decline(f"needs float32, bfloat16 or float16 data and weights (got {dtype}, {w.dtype})", "dnnl")
    if widened and z_v is not None:
        return Decline("a float32 output with a residual", "dnnl")
    if z_v is not None and (static_shape(z_v) != ys or z_v.dtype is None):
        return Decline("the residual does not have the output's static shape", "dnnl")
    compute = compute_dtype(dtype)      # float16 (and bfloat16 without its arithmetic): stored, not computed
    out = y_dtype if widened else compute
    geo = ConvGeometry(ctx)
    s, d, begin, end = geo.resolve(tuple(xs[2:]), tuple(w.shape[2:]))
    if min(begin + end) < 0:
        return Decline("negative pads", "dnnl")
    if len(xs) == 3:                     # 1-D: a 2-D convolution over an image of height 1
        s, d, begin, end = [1, *s], [1, *d], [0, *begin], [0, *end]
    g = geo.group
    co, cig, *k = (int(v) for v in w.shape)
    kh, kw = ([1] + k)[-2:]
    act_ops, after = activation_post_ops(activation, params, exact)
    # the input is read in the output's layout (else staged); a 1x1 image is the same bytes in
    # both, and oneDNN's fast kernels want it described channels-last (squeeze-excite convs)
    nhwc = y_v.layout == "nhwc" or (_single_pixel(ys) and (x_v.layout == "nhwc" or _single_pixel(xs)))
    y_strides = channels_last(ys) if nhwc else strides_of(y_v)
    x_strides = channels_last(xs) if nhwc else contiguous(xs)
    z_strides = None if z_v is None else (y_strides if nhwc and _single_pixel(ys) else strides_of(z_v))
    inplace = (z_v is not None and ctx.inplace_input == 3 and z_v.dtype == y_v.dtype
               and z_strides == y_strides)
    x_md, y_md = _image_md(xs, x_strides, compute), _image_md(ys, y_strides, out)
    z_md, res_ops = None, []
    if z_v is not None:
        if inplace:
            res_ops = [("sum", 1.0)]
        else:
            z_md = _image_md(ys, z_strides, compute)
            res_ops = [("binary", "add", z_md)]
    wdims = [co, cig, kh, kw] if g == 1 else [g, co // g, cig, kh, kw]
    w_any = MemDesc.tagged(wdims, DTYPES[compute], capi.TAG_ANY)
    bias = None if b is None else b.to(torch.float32 if compute == torch.float32 else b.dtype).contiguous()
    b_md = MemDesc.of((co,), bias.dtype) if bias is not None else None
    lib = capi.load()
    macs = conv_macs(ctx, w)

    bias_op = []           # the bias as the first post-op (``_depthwise_bias_post_op``), else none

    def make(post_ops):
        attr = Attr(bias_op + post_ops)
        with threads_for(macs is not None and macs < PARALLEL_MACS):
            return create("convolution", lambda pd: lib.convolution_forward_primitive_desc_create(
                pd, lib.engine, capi.FORWARD_INFERENCE, capi.CONVOLUTION_DIRECT, x_md.handle, w_any.handle,
                None if b_md is None or bias_op else b_md.handle, y_md.handle, Dims(*s),
                Dims(*[v - 1 for v in d]), Dims(*begin), Dims(*end), attr.handle))
    try:
        prim = make(res_ops + act_ops)
        if exact and act_ops and not exact_post_ops(prim.impl):   # an epilogue not checked on NaN / Inf
            act_ops, after = [], activation_after(activation, params)
            prim = make(res_ops)
        if _depthwise_bias_post_op(compute, g, co, cig, bias, prim.impl):
            bias_op = [("binary", "add", MemDesc.of((1, co, 1, 1), bias.dtype))]
            try:
                brdgmm = make(res_ops + act_ops)
            except capi.DnnlError:
                brdgmm = None
            if brdgmm is not None and brdgmm.impl.startswith("brdgmm"):
                prim = brdgmm
            else:
                bias_op = []
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no convolution for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference convolution ({prim.impl})", "dnnl")
    slow = None
    if "gemm" in prim.impl:               # runs, but on the im2col + GEMM fallback: say why
        slow = (f"NCHW data (the layout pass kept this graph NCHW): oneDNN's jit / brgemm convolutions "
                f"read channels-last or blocked data, so {prim.impl}") if not nhwc else \
            (f"oneDNN has no jit / brgemm convolution for groups {g}, kernel {kh}x{kw}, strides {list(s)}, "
             f"dilations {list(d)} ({prim.impl})")
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    plain = w if w.device.type == "meta" else w.to(compute).contiguous()
    plain_md = MemDesc.tagged(wdims, DTYPES[compute], capi.TAG_ABCD if g == 1 else capi.TAG_ABCDE)
    packed = store.form(node.inputs[1].name, plain, range(w.dim()), plain_md, w_md)
    consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))]
    keep = [packed, w_md]
    if bias is not None:
        consts.append((capi.arg_post_op_src1(0) if bias_op else capi.ARG_BIAS,
                       Memory(bias_op[0][2] if bias_op else b_md, bias.data_ptr())))
        keep += [bias, *(op[2] for op in bias_op)]
    x_slot = Slot(capi.ARG_SRC, xs, x_strides, compute, x_md)
    y_slot = Slot(capi.ARG_DST, ys, y_strides, out, y_md)
    if z_v is None:
        kernel = DnnlKernel(prim, [x_slot], y_slot, consts, resources, (0,), after=after, keep=tuple(keep))
    else:
        z_slot = None if inplace else Slot(capi.arg_post_op_src1(len(bias_op)), ys, z_strides, compute, z_md)
        kernel = DnnlKernel(prim, [x_slot, z_slot], y_slot, consts, resources, (0, 3),
                            prefill=1 if inplace else None, after=after, keep=tuple(keep))
    if compute == torch.bfloat16 and "brgconv" in prim.impl and "amx" in prim.impl and max(s) > 1:
        err = _checked_error(kernel, xs, ys, x_strides, z_v is not None, w if w.device.type != "meta" else
                             store.plain(node.inputs[1].name, w, dtype=compute), bias,
                             (s, d, begin, end, g), activation, params)
        if not err <= CHECK_TOLERANCE:
            return Decline(f"oneDNN's {prim.impl} computed this strided bfloat16 convolution wrongly in the "
                           f"bind-time check (relative error {err:.2g} against float32 arithmetic on the same "
                           f"bfloat16 values): this oneDNN's AMX brgemm convolutions miscompute some strided "
                           f"geometries", "dnnl")
    kernel.slow = slow
    return kernel


def _depthwise_bias_post_op(compute, groups: int, co: int, cig: int, bias, impl: str) -> bool:
    """A bfloat16 depthwise convolution with a float32 bias that did not get oneDNN's brgemm
    depthwise kernel (``brdgmm``): this oneDNN offers that kernel for bfloat16 only without a
    float32 bias, and its ``jit_dw`` alternative is slower. The bias then becomes the first
    post-op (a binary add of one float32 per channel onto the float32 accumulator, before the
    residual and the activation: the same arithmetic as the bias argument)."""
    return (compute == torch.bfloat16 and groups == co and cig == 1 and bias is not None
            and bias.dtype == torch.float32 and not impl.startswith("brdgmm"))


CHECK_TOLERANCE = 0.05       # far above bfloat16's rounding of the output, far below a miscomputed result


def _checked_error(kernel, xs, ys, x_strides, residual: bool, weight, bias, geometry, activation, params) -> float:
    """The relative L2 error of ``kernel`` on a fixed random bfloat16 input (a zero residual)
    against ATen's float32 convolution of the same values: this oneDNN's AMX brgemm
    convolution writes wrong numbers for some strided geometries (a 2x2 kernel at stride 2
    over 80 channels; later oneDNN releases fixed bugs of this family), so a strided one is run
    once here before it is trusted."""
    s, d, begin, end, g = geometry
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(xs, generator=gen).to(torch.bfloat16)
    x = torch.empty_strided(xs, x_strides, dtype=torch.bfloat16).copy_(x)
    args = (x, torch.zeros(ys, dtype=torch.bfloat16)) if residual else (x,)
    got = kernel(*args).float()
    x4, w4 = x.float(), weight.float()
    if x4.dim() == 3:                     # a 1-D convolution, as the kernel describes it: height 1
        x4, w4 = x4.unsqueeze(2), w4.unsqueeze(2)
    x4 = torch.nn.functional.pad(x4, (begin[1], end[1], begin[0], end[0]))
    want = torch.nn.functional.conv2d(x4, w4, None if bias is None else bias.float(), stride=tuple(s),
                                      dilation=tuple(d), groups=g)
    want = ACTIVATIONS[activation](want.reshape(ys), params)
    return float((got - want).norm() / want.norm().clamp_min(1e-30))
