"""``fusegraph::GatedLinear`` of static shape as two oneDNN matmuls whose epilogues do the gating:
``act(x @ w_gate^T + b_gate) * (x @ w_up^T + b_up)``.

The gate's product writes float32 into a buffer of this thread with the activation as its
post-op; the up projection's product then multiplies by that buffer in its own epilogue (a
binary ``mul`` post-op) and writes the output, rounded once to its type. A gated MLP packed as
one product and a ``GatedActivation`` after it (the dynamic-rows form) reads and writes the
packed result again in several passes; here nothing but the gate's buffer is written twice.

The activation is a post-op where oneDNN's eltwise is exact on NaN / Inf (SiLU as ``swish``,
ReLU as ``elu`` with alpha 0, the sigmoid: ``linear.EXACT``), and where the primitive's
implementation is one whose post-ops are checked (``exact_post_ops``). A GELU's eltwise is
ONNX's for finite inputs only: in the exact form the gate is written plain, one max over it
looks for a NaN or +inf, and the GELU then runs as oneDNN's eltwise over its rows
(``rows_eltwise.py``) or, where one is there, as the op's own. ``Config.fast_math``: every
activation as its post-op. Float32 or bfloat16 operands (float16 computed as float32, as
``linear.py`` does), both weights constants, row-major input and output; anything else
declines with its reason and the op's own kernel runs.
"""
from __future__ import annotations

import math
import threading

import torch

from .....ops.fused_decoder import ACTIVATIONS
from ...protocol import Decline
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS, threads_for
from . import capi
from .call import DnnlKernel, Slot
from .compute import compute_dtype
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .linear import EXACT, FAST
from .memory import DTYPES, MemDesc, Memory
from .primitive import Attr, create, exact_post_ops
from .rows_eltwise import RowsEltwise

TYPES = (torch.float32, torch.bfloat16, torch.float16)
GELUS = ("gelu", "gelu_tanh")
_INF = float("inf")


def gated_linear_kernel(ctx, store, resources, exact: bool = True):
    """The kernel of one GatedLinear node, or a ``Decline`` saying why not."""
    node = ctx.node
    name = str(ctx.attr("activation", ""))
    if name not in ACTIVATIONS:
        return Decline(f"activation {name!r}", "dnnl")
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs, ys = static_shape(x_v), static_shape(y_v)
    if xs is None or ys is None:
        return Decline("needs static shapes", "dnnl")
    dtype = dtype_of(x_v)
    if dtype not in TYPES or dtype_of(y_v) != dtype:
        return Decline(f"needs float32, bfloat16 or float16 data and an output of its type (got {dtype})", "dnnl")
    if strides_of(x_v) != contiguous(xs) or strides_of(y_v) != contiguous(ys):
        return Decline("needs row-major input and output", "dnnl")
    weights = [ctx.const(1), ctx.const(2)]
    biases = [ctx.const(i) if ctx.has_input(i) else None for i in (3, 4)]
    if any(w is None or w.dim() != 2 or w.dtype != dtype or w.device.type not in ("cpu", "meta") for w in weights) \
            or any(ctx.has_input(i) and b is None for i, b in zip((3, 4), biases)):
        return Decline("weights or biases are not constants of the input's type", "dnnl")
    n, k = weights[0].shape
    m = math.prod(xs[:-1])
    if tuple(weights[1].shape) != (n, k) or xs[-1] != k or ys[-1] != n or math.prod(ys[:-1]) != m \
            or any(b is not None and b.numel() != n for b in biases):
        return Decline("operand sizes do not match", "dnnl")
    compute = compute_dtype(dtype)
    act_post = ({**EXACT, **FAST} if not exact else EXACT).get(name)
    lib = capi.load()
    x_md, g_md, y_md = MemDesc.of((m, k), compute), MemDesc.of((m, n), torch.float32), MemDesc.of((m, n), compute)
    w_any = MemDesc.tagged([k, n], DTYPES[compute], capi.TAG_ANY)

    def make(bias, dst_md, post_ops):
        b_md = None if bias is None else MemDesc.of((1, n), bias.dtype)
        attr = Attr(post_ops)
        with threads_for(m * n * k < SERIAL_MACS and n * k < PARALLEL_WEIGHTS):
            prim = create("matmul", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, x_md.handle, w_any.handle, b_md.handle if b_md is not None else None,
                dst_md.handle, attr.handle))
        return prim, b_md, attr

    bias_of = [None if b is None else b.to(torch.float32 if compute == torch.float32 else b.dtype).contiguous()
               for b in biases]
    try:
        gate_post = act_post or []
        gate = make(bias_of[0], g_md, gate_post)
        if exact and gate_post and not exact_post_ops(gate[0].impl):
            gate_post, gate = [], make(bias_of[0], g_md, [])
        up = make(bias_of[1], y_md, [("binary", "mul", g_md)])
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no matmul for this node: {exc}", "dnnl")
    if gate[0].is_reference or up[0].is_reference:
        return Decline(f"oneDNN offers only its reference matmul ({gate[0].impl}, {up[0].impl})", "dnnl")

    kernels = []
    x_slot = Slot(capi.ARG_SRC, xs, contiguous(xs), compute, x_md)
    for i, ((prim, b_md, attr), bias) in enumerate(zip((gate, up), bias_of)):
        w_md = prim.md(capi.Q_WEIGHTS_MD)
        w = weights[i]
        plain = w if w.device.type == "meta" else w.to(compute).contiguous()
        packed = store.form(node.inputs[1 + i].name, plain, (1, 0), MemDesc.of((k, n), compute, (1, k)), w_md)
        consts = [(capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr()))]
        keep = [packed, w_md, attr]
        if bias is not None:
            consts.append((capi.ARG_BIAS, Memory(b_md, bias.data_ptr())))
            keep.append(bias)
        if i == 0:
            g_slot = Slot(capi.ARG_DST, (m, n), (n, 1), torch.float32, g_md)
            kernels.append(DnnlKernel(prim, [x_slot], g_slot, consts, resources, (0,), keep=tuple(keep)))
        else:
            y_slot = Slot(capi.ARG_DST, ys, contiguous(ys), compute, y_md)
            g_in = Slot(capi.arg_post_op_src1(0), (m, n), (n, 1), torch.float32, g_md)
            kernels.append(DnnlKernel(prim, [Slot(capi.ARG_SRC, xs, contiguous(xs), compute, x_md), g_in], y_slot,
                                      consts, resources, (0, 1), keep=tuple(keep)))
    after = None
    if not gate_post:
        after = _GeluRows(n, name, resources) if name in GELUS else _Activation(ACTIVATIONS[name])
        if isinstance(after, _GeluRows) and after.rows.is_reference:
            after = _Activation(ACTIVATIONS[name])
    return GatedProducts(kernels[0], kernels[1], (m, n), after, resources)


class _Activation:
    """The op's own activation over the gate, in place."""
    def __init__(self, act):
        self.act = act

    def __call__(self, g: torch.Tensor) -> None:
        self.act(g, g)


class _GeluRows:
    """A GELU over the gate's rows by oneDNN's eltwise where one max finds no NaN and no +inf;
    the op's own GELU otherwise (it keeps them as ONNX says)."""
    def __init__(self, n: int, name: str, resources):
        self.rows = RowsEltwise(n, FAST[name][0], resources)
        self.act = ACTIVATIONS[name]

    def __call__(self, g: torch.Tensor) -> None:
        if bool(g.amax() < _INF):
            self.rows(g.data_ptr(), g.shape[0])
        else:
            self.act(g, g)


class GatedProducts:
    """The gate's product into this thread's float32 buffer, then the up projection's, which
    multiplies by it in its epilogue."""
    writes_out = True
    reads = (0,)

    def __init__(self, gate: DnnlKernel, up: DnnlKernel, gate_shape: tuple, after, resources):
        self.gate, self.up, self.gate_shape, self.after = gate, up, gate_shape, after
        self.impl = up.impl
        self._views: dict[int, torch.Tensor] = {}
        # one float32 buffer per thread, shared by the model's gated products: the largest one's size
        self._buffers = resources.shared.setdefault("gated products float32", {})
        sizes = resources.shared.setdefault("gated products float32 elements", [0])
        sizes[0] = max(sizes[0], math.prod(gate_shape))
        self._largest = sizes

    def __call__(self, x, w_gate=None, w_up=None, b_gate=None, b_up=None, out=None):
        g = self._views.get(threading.get_ident())
        if g is None:
            g = self._view()
        self.gate(x, out=g)
        if self.after is not None:
            self.after(g)
        return self.up(x, g, out=out)

    def _view(self) -> torch.Tensor:
        tid = threading.get_ident()
        count = math.prod(self.gate_shape)
        buf = self._buffers.get(tid)
        if buf is None or buf.numel() < count:
            with torch.inference_mode(False):
                buf = self._buffers[tid] = torch.empty(max(count, self._largest[0]), dtype=torch.float32)
        g = self._views[tid] = buf[:count].view(self.gate_shape)
        return g
