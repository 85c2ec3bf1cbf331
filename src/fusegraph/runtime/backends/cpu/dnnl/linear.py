"""``fusegraph::LinearAct`` / ``fusegraph::Linear`` with a constant weight as one oneDNN matmul:
``act(x @ W + b)``.

``x`` of shape ``[..., K]`` is read as ``[M, K]`` (row-major, as the layout pass leaves
non-4-D values; another layout is staged; float16 data is computed as float32, as for
convolutions: ``conv.py``); ``W`` (``[K, N]``, or ``[N, K]`` with ``trans_b``)
is reordered once into the blocked layout the primitive picks and not read from the graph at
run time; ``b`` is broadcast over rows. The activation is a post-op where oneDNN's eltwise is
exact on NaN / Inf (relu as ``elu`` with alpha 0, sigmoid, tanh, silu as ``swish``); GELU's
eltwise gives NaN for +-inf, so it runs after the product in place with torch, unless
``Config.fast_math``. Products under ``SERIAL_MACS`` multiply-adds with weights under
``PARALLEL_WEIGHTS`` elements are made for one thread. A bfloat16 product whose node has a
float32 output (``out_dtype``: a Cast folded in, ``passes/fold_casts.py``) writes float32,
the accumulations unrounded.
"""
from __future__ import annotations

import math

import torch

from .....ops.fused_transformer import ACTIVATIONS
from ...protocol import Decline
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS, threads_for
from . import capi
from .call import DnnlKernel, Slot
from .compute import compute_dtype
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .memory import DTYPES, MemDesc, Memory
from .primitive import Attr, create, exact_post_ops

TYPES = (torch.float32, torch.bfloat16, torch.float16)
WIDENED = (torch.bfloat16, torch.float32)   # bfloat16 products written as float32 (``out_dtype``)
EXACT = {"none": [], "relu": [("eltwise", "elu", 0.0, 0.0)], "sigmoid": [("eltwise", "logistic", 0.0, 0.0)],
         "tanh": [("eltwise", "tanh", 0.0, 0.0)], "silu": [("eltwise", "swish", 1.0, 0.0)]}
FAST = {"relu": [("eltwise", "relu", 0.0, 0.0)], "gelu": [("eltwise", "gelu_erf", 0.0, 0.0)],
        "gelu_tanh": [("eltwise", "gelu_tanh", 0.0, 0.0)]}


def product_operands(ctx) -> tuple[str, bool, torch.Tensor, torch.Tensor | None] | Decline:
    """(activation, trans_b, weight, bias) of a Linear / LinearAct node whose activation oneDNN
    can run and whose weight (2-D) and bias are constants, or a ``Decline`` saying which is
    not (shared with the run-time-rows kernel, ``linear_runtime.py``)."""
    node = ctx.node
    activation = str(ctx.attr("activation", "none")) if node.op_type == "LinearAct" else "none"
    if activation != "none" and activation not in ACTIVATIONS:
        return Decline(f"activation {activation!r}", "dnnl")
    w, b = ctx.const(1), ctx.const(2)
    if w is None or w.device.type not in ("cpu", "meta") or w.dim() != 2 or \
            (len(node.inputs) > 2 and node.inputs[2] is not None and b is None):
        return Decline("weight or bias is not a constant 2-D / 1-D tensor", "dnnl")
    return activation, bool(ctx.attr("trans_b", 0)), w, b


def linear_kernel(ctx, store, resources, exact: bool = True):
    node = ctx.node
    got = product_operands(ctx)
    if isinstance(got, Decline):
        return got
    activation, trans_b, w, b = got
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    if xs is None or ys is None or len(xs) < 1:
        return Decline("needs static shapes", "dnnl")
    dtype = dtype_of(x_v)
    y_dtype = y_v.dtype.to_torch()
    if dtype not in TYPES or w.dtype != dtype or (y_dtype != dtype and (dtype, y_dtype) != WIDENED):
        return Decline(f"needs float32, bfloat16 or float16 data and weight (got {dtype}, {w.dtype})", "dnnl")
    compute = compute_dtype(dtype)      # float16 (and bfloat16 without its arithmetic): stored, not computed
    out = y_dtype if y_dtype != dtype else compute
    if strides_of(x_v) != contiguous(xs) or strides_of(y_v) != contiguous(ys):
        return Decline("needs row-major input and output", "dnnl")
    n, k = (w.shape[0], w.shape[1]) if trans_b else (w.shape[1], w.shape[0])
    m = math.prod(xs[:-1])
    if xs[-1] != k or ys[-1] != n or math.prod(ys[:-1]) != m or (b is not None and b.numel() != n):
        return Decline("operand sizes do not match", "dnnl")
    post = (EXACT if exact else {**EXACT, **FAST}).get(activation)
    after = None
    if post is None:
        post, after = [], _after(activation)
    x_md, y_md = MemDesc.of((m, k), compute), MemDesc.of((m, n), out)
    w_any = MemDesc.tagged([k, n], DTYPES[compute], capi.TAG_ANY)
    bias = None if b is None else b.to(torch.float32 if compute == torch.float32 else b.dtype).contiguous()
    b_md = MemDesc.of((1, n), bias.dtype) if bias is not None else None
    lib = capi.load()

    def make(post_ops):
        attr = Attr(post_ops)
        with threads_for(m * n * k < SERIAL_MACS and n * k < PARALLEL_WEIGHTS):
            return create("matmul", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, x_md.handle, w_any.handle, b_md.handle if b_md is not None else None,
                y_md.handle, attr.handle))
    try:
        prim = make(post)
        if exact and post and not exact_post_ops(prim.impl):   # an epilogue not checked on NaN / Inf
            prim, after = make([]), _after(activation)
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no matmul for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference matmul ({prim.impl})", "dnnl")
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    plain = w if w.device.type == "meta" else w.to(compute).contiguous()
    plain_md = MemDesc.of((k, n), compute, (1, k) if trans_b else (n, 1))   # the operand is W^T under trans_b
    packed = store.form(node.inputs[1].name, plain, (1, 0) if trans_b else (0, 1), plain_md, w_md)
    consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))]
    keep = [packed, w_md]
    if bias is not None:
        consts.append((capi.ARG_BIAS, Memory(b_md, bias.data_ptr())))
        keep.append(bias)
    x_slot = Slot(capi.ARG_SRC, xs, contiguous(xs), compute, x_md)
    y_slot = Slot(capi.ARG_DST, ys, contiguous(ys), out, y_md)
    return DnnlKernel(prim, [x_slot], y_slot, consts, resources, (0,), after=after, keep=tuple(keep))


def _after(activation: str):
    act = ACTIVATIONS[activation]
    return lambda y, _inputs: act(y)
