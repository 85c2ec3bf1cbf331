"""``fusegraph::GatedLinear`` of static shape as two oneDNN matmuls whose epilogues do the gating:
``act(x @ w_gate^T + b_gate) * (x @ w_up^T + b_up)``.

The gate's product writes float32 into a temporary of this thread's buffer with the activation
as its post-op; the up projection's product then multiplies by that buffer in its own epilogue (a
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
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS
from . import capi
from .call import DnnlKernel, Slot
from .compute import compute_dtype
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .linear import EXACT, FAST, matmul_primitive, weight_arguments
from .memory import DTYPES, MemDesc
from .primitive import exact_post_ops
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
    x_md, g_md, y_md = MemDesc.of((m, k), compute), MemDesc.of((m, n), torch.float32), MemDesc.of((m, n), compute)
    w_any = MemDesc.tagged([k, n], DTYPES[compute], capi.TAG_ANY)
    bias_of = [None if b is None else b.to(torch.float32 if compute == torch.float32 else b.dtype).contiguous()
               for b in biases]
    b_mds = [None if b is None else MemDesc.of((1, n), b.dtype) for b in bias_of]
    serial = m * n * k < SERIAL_MACS and n * k < PARALLEL_WEIGHTS
    try:
        gate_post = act_post or []
        gate = matmul_primitive(x_md, w_any, b_mds[0], g_md, gate_post, serial)
        if exact and gate_post and not exact_post_ops(gate.impl):
            gate_post, gate = [], matmul_primitive(x_md, w_any, b_mds[0], g_md, [], serial)
        up = matmul_primitive(x_md, w_any, b_mds[1], y_md, [("binary", "mul", g_md)], serial)
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no matmul for this node: {exc}", "dnnl")
    if gate.is_reference or up.is_reference:
        return Decline(f"oneDNN offers only its reference matmul ({gate.impl}, {up.impl})", "dnnl")
    args = [weight_arguments(store, node.inputs[1 + i].name, weights[i], True, compute, prim.md(capi.Q_WEIGHTS_MD),
                             bias_of[i], b_mds[i]) for i, prim in enumerate((gate, up))]
    (gate_consts, gate_keep), (up_consts, up_keep) = args
    g_slot = Slot(capi.ARG_DST, (m, n), (n, 1), torch.float32, g_md)
    gate_kernel = DnnlKernel(gate, [Slot(capi.ARG_SRC, xs, contiguous(xs), compute, x_md)], g_slot, gate_consts,
                             resources, (0,), keep=tuple(gate_keep))
    g_in = Slot(capi.arg_post_op_src1(0), (m, n), (n, 1), torch.float32, g_md)
    up_kernel = DnnlKernel(up, [Slot(capi.ARG_SRC, xs, contiguous(xs), compute, x_md), g_in],
                           Slot(capi.ARG_DST, ys, contiguous(ys), compute, y_md), up_consts, resources, (0, 1),
                           keep=tuple(up_keep))
    after = None
    if not gate_post:
        after = _GeluRows(n, name, resources) if name in GELUS else _Activation(ACTIVATIONS[name])
        if isinstance(after, _GeluRows) and after.rows.is_reference:
            after = _Activation(ACTIVATIONS[name])
    return GatedProducts(gate_kernel, up_kernel, (m, n), after, resources)


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
    """The gate's product into a float32 temporary of this thread's buffer (past the two
    primitives' scratchpads, ``Resources.temporary``), then the up projection's, which
    multiplies by it in its epilogue."""
    writes_out = True
    reads = (0,)

    def __init__(self, gate: DnnlKernel, up: DnnlKernel, gate_shape: tuple, after, resources):
        self.gate, self.up, self.gate_shape, self.after = gate, up, gate_shape, after
        self.impl = up.impl
        self._resources = resources
        self._offset = resources.past_scratchpads(gate.prim, up.prim)
        self._bytes = 4 * math.prod(gate_shape)
        resources.need(self._offset + self._bytes)
        self._views: dict[int, torch.Tensor] = {}     # thread -> its temporary (one object: no rebinding)

    def __call__(self, x, w_gate=None, w_up=None, b_gate=None, b_up=None, out=None):
        g = self._views.get(threading.get_ident())
        if g is None:
            g = self._views[threading.get_ident()] = self._resources.temporary(self._offset, self._bytes) \
                .view(torch.float32).view(self.gate_shape)
        self.gate(x, out=g)
        if self.after is not None:
            self.after(g)
        return self.up(x, g, out=out)
