"""``fusegraph::QLinearDynamic`` as one oneDNN int8 matmul whose activation scale and zero
point come at run time: ``y = x_scale * w_scale * ((x_q - x_zp) @ W) + b``, float32.

``x_q`` (uint8 ``[..., K]``, row-major, read as ``[M, K]``) times the int8 weight ``W``
(``[K, N]``, zero point 0) is summed exactly in int32 (u8 x s8 on VNNI: ``int8_support``),
scaled by the source scale and the weight's scales (one, or one per column: a mask over
N), the float32 bias added, written as float32. That is the model's arithmetic (the sum
converted to float32, times the product of the two scales, plus the bias) up to where
oneDNN rounds the scales' product: within one float32 rounding of the dequantised value
(``tests/passes/test_int8_dynamic.py`` checks the bound against onnxruntime). The source scale and zero point are oneDNN
*run-time* arguments (``ARG_ATTR_SCALES | ARG_SRC``, ``ARG_ATTR_ZERO_POINTS | ARG_SRC``):
the primitive is made once, and each call points the scale's memory at the float32 value
the ``DynamicQuantizeLinear`` node computed and copies its uint8 zero point into the int32
the primitive reads (oneDNN 3.2 takes int32 zero points only). The weight is reordered once
into the blocked layout the primitive picks, with the compensation oneDNN keeps beside it
for a source zero point (the same ``WeightStore`` as the other kernels).

Rows known at bind time: one primitive for them. Rows known at run time only (a dynamic
sequence axis): as ``linear_runtime.py`` does for float32, the weight is packed once for a
primitive made for ``REFERENCE_ROWS`` rows, and each new row count gets a primitive made
with that packed layout given explicitly (the last ``ROWS_KEPT`` kept). Only on a CPU whose
int8 kernels sum exactly (``int8_exact``; elsewhere ``int8_float.py``'s float32 form, from the
same checks: ``dynamic_operands``); anything else declines with the reason and the op's
reference form runs (``ops/quantized_dynamic.py``).
"""
from __future__ import annotations

from collections import OrderedDict
from threading import get_ident

import torch

from ...protocol import Decline
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS, threads_for
from . import capi
from .int8_support import NOT_EXACT, QuantArgs, int8_exact
from .layouts import static_shape
from .memory import MemDesc, Memory
from .primitive import Attr, call_arguments, create, thread_stream

ROWS_KEPT = 16                    # primitives kept, one per row count (the most recently used)
REFERENCE_ROWS = 64               # the row count of the bind-time primitive that picks the layout


def dynamic_operands(ctx):
    """(int8 weight ``[K, N]``, its scales, the bias or None) of QLinearDynamic node ``ctx`` as
    a kernel takes them (also ``int8_float.py``'s float32 form), or a ``Decline`` saying why not."""
    node = ctx.node
    w, ws = ctx.const(3), ctx.const(4)
    b = ctx.const(5) if ctx.has_input(5) else None
    x_v = node.inputs[0]
    if w is None or w.device.type not in ("cpu", "meta") or w.dtype != torch.int8 or w.dim() != 2 \
            or (ctx.has_input(5) and b is None):
        return Decline("weight or bias is not a constant (int8 weight, 2-D)", "dnnl")
    if x_v.shape is None or not x_v.shape or x_v.layout == "nhwc":
        return Decline("needs a row-major input of known rank", "dnnl")
    if x_v.dtype is None or x_v.dtype.to_torch() != torch.uint8:
        return Decline(f"a {x_v.dtype} input (uint8, DynamicQuantizeLinear's)", "dnnl")
    k, n = int(w.shape[0]), int(w.shape[1])
    if (isinstance(x_v.shape[-1], int) and x_v.shape[-1] != k) or (b is not None and b.numel() != n):
        return Decline("operand sizes do not match", "dnnl")
    if ws is None or ws.device.type != "cpu" or ws.numel() not in (1, n):
        return Decline("weight scales are not a constant per tensor or per column", "dnnl")
    return w, ws, b


def linear_dynamic_int8_kernel(ctx, store, resources):
    """The oneDNN kernel of one QLinearDynamic node, or a ``Decline`` saying why not."""
    if not int8_exact():
        return Decline(NOT_EXACT, "dnnl")
    got = dynamic_operands(ctx)
    if isinstance(got, Decline):
        return got
    w, ws, b = got
    node, x_v = ctx.node, ctx.node.inputs[0]
    k, n = int(w.shape[0]), int(w.shape[1])
    xs = static_shape(x_v)
    rows = None if xs is None else int(torch.Size(xs[:-1]).numel())
    kernel = DynamicInt8Linear(k, n, ws, b, resources)
    w_any = MemDesc.tagged([k, n], capi.S8, capi.TAG_ANY)
    try:
        prim = kernel.make(rows or REFERENCE_ROWS, w_any)
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no int8 matmul for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference int8 matmul ({prim.impl})", "dnnl")
    w_md = prim.md(capi.Q_WEIGHTS_MD)
    plain = w if w.device.type == "meta" else w.contiguous()
    packed = store.form(node.inputs[3].name, plain, (0, 1), MemDesc.of((k, n), torch.int8, (n, 1)), w_md)
    kernel.set_weight(packed, w_md, prim if rows else None, rows)
    return kernel


class DynamicInt8Linear:
    """A product of uint8 rows quantised at run time by one packed int8 weight."""
    writes_out = True
    reads = (0, 1, 2)                  # x_q, its scale, its zero point (the rest are packed constants)

    def __init__(self, k: int, n: int, w_scale: torch.Tensor, bias, resources):
        self.k, self.n = k, n
        self._resources = resources
        self._lib = capi.load()
        self._exec = self._lib.execute
        self._w_mask = 0 if w_scale.numel() == 1 else 2          # per column N of the [K, N] operand
        self._attr = Attr((), scales={capi.ARG_SRC: 0, capi.ARG_WEIGHTS: self._w_mask},
                          zero_points={capi.ARG_SRC: 0})
        self._bias = None if bias is None else bias.to(torch.float32).reshape(-1).contiguous()
        self._b_md = MemDesc.of((1, n), torch.float32) if self._bias is not None else None
        consts = QuantArgs()
        consts.scales(capi.ARG_WEIGHTS, w_scale.to(torch.float32))
        self._zp = torch.zeros(1, dtype=torch.int32)              # the run's source zero point, as int32
        self._scale_md = MemDesc.of((1,), torch.float32)
        self._zp_md = MemDesc.of((1,), torch.int32)
        self._keep = [consts, self._zp]
        self._consts = list(consts.args)
        self._consts.append((capi.ARG_ATTR_ZERO_POINTS | capi.ARG_SRC, Memory(self._zp_md, self._zp.data_ptr())))
        if self._bias is not None:
            self._consts.append((capi.ARG_BIAS, Memory(self._b_md, self._bias.data_ptr())))
        self._rows: OrderedDict[int, tuple] = OrderedDict()
        self._tid = None
        self._static = None            # the bind-time rows' prepared call, when the rows are static
        self._w_md = self._packed = None
        self.impl = "portable"

    def make(self, m: int, w_md: MemDesc):
        """An int8 matmul primitive for ``m`` rows reading weights laid out as ``w_md``."""
        x_md = MemDesc.of((m, self.k), torch.uint8)
        y_md = MemDesc.of((m, self.n), torch.float32)
        small = m * self.n * self.k < SERIAL_MACS and self.n * self.k < PARALLEL_WEIGHTS
        with threads_for(small):
            return create("int8 matmul", lambda pd: self._lib.matmul_primitive_desc_create(
                pd, self._lib.engine, x_md.handle, w_md.handle, self._b_md.handle if self._b_md is not None else None,
                y_md.handle, self._attr.handle))

    def set_weight(self, packed: torch.Tensor, w_md: MemDesc, prim, rows: int | None) -> None:
        self._packed, self._w_md = packed, w_md
        self._consts.insert(0, (capi.ARG_WEIGHTS, Memory(w_md, packed.data_ptr())))
        if prim is not None:
            self._rows[rows] = self._prepare(prim, rows)
            self._static = rows
        self.impl = (prim if prim is not None else self.make(REFERENCE_ROWS, w_md)).impl

    def _prepare(self, prim, m: int) -> tuple:
        x = Memory(MemDesc.of((m, self.k), torch.uint8), 0)
        y = Memory(MemDesc.of((m, self.n), torch.float32), 0)
        scale = Memory(self._scale_md, 0)
        args, nargs, scratch = call_arguments(
            prim, [(capi.ARG_SRC, x), (capi.ARG_DST, y), (capi.ARG_ATTR_SCALES | capi.ARG_SRC, scale)] + self._consts,
            self._resources)
        return prim, x, y, scale, args, nargs, scratch

    def _for_rows(self, m: int) -> tuple:
        got = self._rows.get(m)
        if got is not None:
            return got
        prim = self.make(m, self._w_md)
        if prim.is_reference:
            raise RuntimeError(f"oneDNN has no int8 matmul of {m} x {self.k} x {self.n} for the packed weight")
        got = self._rows[m] = self._prepare(prim, m)
        while len(self._rows) > ROWS_KEPT:
            self._rows.popitem(last=False)
        return got

    def __call__(self, x: torch.Tensor, x_scale: torch.Tensor, x_zp: torch.Tensor, *_unused,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.k or x.dtype != torch.uint8:
            raise ValueError(f"oneDNN int8 matmul: input {x.dtype} {tuple(x.shape)}, expected uint8 [..., {self.k}]")
        m = x.numel() // self.k if self.k else 0
        if out is None:
            out = torch.empty((*x.shape[:-1], self.n), dtype=torch.float32)
        if m == 0:
            return out
        if not x.is_contiguous():
            x = x.contiguous()
        if not out.is_contiguous() or out.dtype != torch.float32:
            raise TypeError(f"oneDNN int8 matmul: output is {out.dtype} {tuple(out.stride())}, expected a row-major "
                            f"float32")
        if x_scale.dtype != torch.float32 or x_scale.numel() != 1 or x_zp.numel() != 1:
            raise ValueError("oneDNN int8 matmul: the activation scale / zero point is not one float32 / uint8")
        if self._tid != get_ident():                     # another thread: its own scratchpad
            self._tid = get_ident()
            self._rows.clear()
        prim, xm, ym, sm, args, nargs, _scratch = self._for_rows(m)
        self._zp.copy_(x_zp.reshape(1))
        xm.point(x.data_ptr())
        ym.point(out.data_ptr())
        sm.point(x_scale.data_ptr())
        status = self._exec(prim.handle, thread_stream(), nargs, args)
        if status:
            raise capi.DnnlError("execute int8 matmul", status)
        return out
