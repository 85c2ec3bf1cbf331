"""``fusegraph::LinearAct`` / ``fusegraph::Linear`` with a constant weight whose rows are only
known at run time (a model with symbolic input dims): one oneDNN matmul made once with a
*run-time* M (``DNNL_RUNTIME_DIM_VAL``), for every shape.

``x`` of shape ``[..., K]`` is read as ``[M, K]`` (row-major), ``y = act(x @ W + b)`` written as
``[M, N]``; the weight is packed once into the layout the primitive picks (the same
``WeightStore`` as the static kernels), the bias is a float32 ``[1, N]`` operand. Only the
input and output descriptors change with M: each call looks its M up in a small cache of
memory objects and argument arrays (made at the first call with that M: a few microseconds),
points them at the call's tensors and executes. The activation is a post-op where oneDNN's
eltwise is exact on NaN / Inf and the implementation's epilogue was checked for it
(``primitive.exact_post_ops``); otherwise it runs after the product, in place, with torch
(GELU always, unless ``Config.fast_math``). Anything else declines with a reason (the static
kernel of ``linear.py`` takes a node whose shapes are static).
"""
from __future__ import annotations

from threading import get_ident

import torch

from .....ops.fused_transformer import ACTIVATIONS
from ...protocol import Decline
from . import capi
from .capi import ExecArg
from .compute import compute_dtype
from .memory import DTYPES, MemDesc, Memory
from .primitive import Attr, create, exact_post_ops, thread_stream

RUNTIME_DIM = -(2 ** 63)          # DNNL_RUNTIME_DIM_VAL
TYPES = (torch.float32, torch.bfloat16)
EXACT = {"none": [], "relu": [("eltwise", "elu", 0.0, 0.0)], "sigmoid": [("eltwise", "logistic", 0.0, 0.0)],
         "tanh": [("eltwise", "tanh", 0.0, 0.0)], "silu": [("eltwise", "swish", 1.0, 0.0)]}
FAST = {"relu": [("eltwise", "relu", 0.0, 0.0)], "gelu": [("eltwise", "gelu_erf", 0.0, 0.0)],
        "gelu_tanh": [("eltwise", "gelu_tanh", 0.0, 0.0)]}
ROWS_KEPT = 64                    # argument arrays kept, one per M seen (most recent)


def runtime_linear_kernel(ctx, store, resources, exact: bool = True):
    """The run-time-M kernel of a Linear / LinearAct node whose input rows are symbolic, or a
    ``Decline`` saying why not."""
    node = ctx.node
    activation = str(ctx.attr("activation", "none")) if node.op_type == "LinearAct" else "none"
    if activation != "none" and activation not in ACTIVATIONS:
        return Decline(f"activation {activation!r}", "dnnl")
    trans_b = bool(ctx.attr("trans_b", 0))
    w, b = ctx.const(1), ctx.const(2)
    x_v, y_v = node.inputs[0], node.outputs[0]
    if w is None or w.device.type not in ("cpu", "meta") or w.dim() != 2 or \
            (len(node.inputs) > 2 and node.inputs[2] is not None and b is None):
        return Decline("weight or bias is not a constant 2-D / 1-D tensor", "dnnl")
    if x_v.shape is None or not x_v.shape or x_v.layout == "nhwc":
        return Decline("needs a row-major input of known rank", "dnnl")
    dtype = x_v.dtype.to_torch() if x_v.dtype is not None else None
    if dtype not in TYPES or w.dtype != dtype or y_v.dtype != x_v.dtype:
        return Decline(f"needs float32 or bfloat16 data, weight and output (got {dtype}, {w.dtype})", "dnnl")
    compute = compute_dtype(dtype)
    n, k = (w.shape[0], w.shape[1]) if trans_b else (w.shape[1], w.shape[0])
    if (isinstance(x_v.shape[-1], int) and x_v.shape[-1] != k) or (b is not None and b.numel() != n):
        return Decline("operand sizes do not match", "dnnl")
    lib = capi.load()
    x_md = MemDesc.of((RUNTIME_DIM, k), compute, (k, 1))
    y_md = MemDesc.of((RUNTIME_DIM, n), compute, (n, 1))
    w_any = MemDesc.tagged([k, n], DTYPES[compute], capi.TAG_ANY)
    bias = None if b is None else b.to(torch.float32).contiguous()
    b_md = MemDesc.of((1, n), torch.float32) if bias is not None else None

    def make(post_ops):
        attr = Attr(post_ops)
        return create("matmul", lambda pd: lib.matmul_primitive_desc_create(
            pd, lib.engine, x_md.handle, w_any.handle, b_md.handle if b_md is not None else None,
            y_md.handle, attr.handle))
    post = (EXACT if exact else {**EXACT, **FAST}).get(activation)
    after = post is None
    try:
        prim = make(post or [])
        if exact and post and not exact_post_ops(prim.impl):      # an epilogue not checked on NaN / Inf
            prim, after = make([]), True
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no run-time-M matmul for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference matmul ({prim.impl})", "dnnl")
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    plain = w if w.device.type == "meta" else w.to(compute).contiguous()
    plain_md = MemDesc.of((k, n), compute, (1, k) if trans_b else (n, 1))
    packed = store.form(node.inputs[1].name, plain, (1, 0) if trans_b else (0, 1), plain_md, w_md)
    act = ACTIVATIONS[activation] if after and activation != "none" else None
    return RuntimeLinear(prim, k, n, compute, packed, w_md, bias, b_md, resources, act)


class RuntimeLinear:
    """A matmul primitive with run-time M, called with ``x`` of any ``[..., K]`` shape."""
    writes_out = True
    reads = (0,)

    def __init__(self, prim, k: int, n: int, dtype: torch.dtype, packed: torch.Tensor, w_md: MemDesc,
                 bias: torch.Tensor | None, b_md: MemDesc | None, resources, activation):
        self.prim, self.k, self.n, self.dtype = prim, k, n, dtype
        self._keep = (packed, w_md, bias, b_md)
        self._consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))]
        if bias is not None:
            self._consts.append((capi.ARG_BIAS, Memory(b_md, bias.data_ptr())))
        self._resources = resources
        resources.need(prim.scratchpad_bytes)
        self._rows: dict[int, tuple] = {}                 # M -> (x memory, y memory, args, n args)
        self._exec = capi.load().execute
        self._activation = activation
        self._tid = None

    @property
    def impl(self) -> str:
        return self.prim.impl

    def _for_rows(self, m: int) -> tuple:
        got = self._rows.get(m)
        if got is None:
            x = Memory(MemDesc.of((m, self.k), self.dtype), 0)
            y = Memory(MemDesc.of((m, self.n), self.dtype), 0)
            stream, scratch = self._resources.for_thread(self.prim.scratchpad_bytes)
            args = [ExecArg(capi.ARG_SRC, x.handle), ExecArg(capi.ARG_DST, y.handle)]
            args += [ExecArg(arg, mem.handle) for arg, mem in self._consts]
            if scratch is not None:
                args.append(ExecArg(capi.ARG_SCRATCHPAD, scratch.handle))
            array = (ExecArg * len(args))(*args)
            got = (x, y, array, len(args), scratch)
            if len(self._rows) >= ROWS_KEPT:
                self._rows.pop(next(iter(self._rows)))
            self._rows[m] = got
        return got

    def __call__(self, x: torch.Tensor, *_unused, out: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.k:
            raise ValueError(f"oneDNN matmul: input {tuple(x.shape)} does not end in the weight's {self.k} rows")
        m = x.numel() // self.k if self.k else 0
        if out is None:
            out = torch.empty((*x.shape[:-1], self.n), dtype=self.dtype)
        if x.dtype != self.dtype or not x.is_contiguous():
            x = x.to(self.dtype).contiguous()
        if m == 0:
            return out
        if not out.is_contiguous() or out.dtype != self.dtype:
            raise TypeError(f"oneDNN matmul: output is {out.dtype} {tuple(out.stride())}, expected a row-major "
                            f"{self.dtype}")
        if self._tid != get_ident():                     # another thread: its own stream and scratchpad
            self._tid = get_ident()
            self._rows.clear()
        xm, ym, args, nargs, _scratch = self._for_rows(m)
        xm.point(x.data_ptr())
        ym.point(out.data_ptr())
        status = self._exec(self.prim.handle, thread_stream(), nargs, args)
        if status:
            raise capi.DnnlError("execute run-time-M matmul", status)
        if self._activation is not None:
            self._activation(out)
        return out

