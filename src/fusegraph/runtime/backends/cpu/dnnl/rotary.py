"""``fusegraph::RotaryEmbedding`` with constant cos / sin tables as three oneDNN calls over the
rows of x as it lies in memory: ``x * cos + cat(-x2, x1) * sin``.

The op's own kernels (ATen) rotate a strided view of the heads in four or five calls that
convert types and broadcast the tables on every run. Here the tables are broadcast once, at
bind time, into x's own memory order (``[rows, D]``: a row is one head's D values at one
position), so that every call is a dense, unbroadcast oneDNN kernel:

1. a reorder of the second halves ``x2`` into the first half of a float32 buffer, each value
   scaled by ``-sin`` (the reorder's per-element source scales),
2. the same of the first halves ``x1`` into the second half, scaled by ``sin``,
3. a binary ``x * cos`` with the buffer added in its epilogue (a ``binary add`` post-op),
   written to the output and rounded once to its type.

Each value is what the graph's float32 arithmetic gives (one product per term, one sum: ONNX's
NaN / Inf, a product with a zero of the table included): x is rotated in float32 and rounded
once, as the op's own reduced-type kernel does. The tables of the model's nodes with equal cos /
sin and the same row layout are held once (``Resources.shared``); the buffer is a temporary of
the thread's buffer that the model's oneDNN kernels share (``Resources.temporary``). Bfloat16 x of static shape, row-major, an even last axis;
anything else declines with its reason (the op's own kernel runs). A float32 rotation is not
taken (None, no decline): its own kernel writes the output in place in three ATen passes, as
fast inside a run (benchmarks/RESULTS.md), without this kernel's tables and buffer.
"""
from __future__ import annotations

import threading

import torch

from .....ops.fused_decoder import rotary_views
from ...protocol import Decline
from . import capi
from .capi import ExecArg
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create, thread_stream

TYPES = (torch.bfloat16,)
BOTH_DIMS = 3                      # a scale per element of a [rows, half] source (mask of dims 0 and 1)


def rotary_kernel(ctx, resources):
    """The kernel of one RotaryEmbedding node, None for float32 x, or a ``Decline`` saying why not."""
    node = ctx.node
    x_v, y_v = node.inputs[0], node.outputs[0]
    xs = static_shape(x_v)
    dtype = dtype_of(x_v)
    if dtype == torch.float32:
        return None             # the op's own kernel is as fast: not a oneDNN kernel's to take
    if xs is None or dtype not in TYPES or dtype_of(y_v) != dtype or static_shape(y_v) != xs:
        return Decline("needs bfloat16 x of static shape and an output like it", "dnnl")
    if strides_of(x_v) != contiguous(xs) or strides_of(y_v) != contiguous(xs):
        return Decline("needs row-major x and output", "dnnl")
    cos, sin = ctx.const(1), ctx.const(2)
    if cos is None or sin is None or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        return Decline("cos / sin are not float32 constants (computed at run time)", "dnnl")
    heads = int(ctx.attr("heads", 0))
    try:
        tables = _tables(xs, cos, sin, heads, resources)
    except RuntimeError as exc:
        return Decline(f"the tables do not fit x: {exc}", "dnnl")
    if isinstance(tables, Decline):
        return tables
    rows, d = tables[0].shape
    half = d // 2
    lib = capi.load()
    x_half, buf_half = MemDesc.of((rows, half), dtype, (d, 1)), MemDesc.of((rows, half), torch.float32, (d, 1))
    x_md, buf_md, scales_md = MemDesc.of((rows, d), dtype), MemDesc.of((rows, d), torch.float32), \
        MemDesc.of((rows * half,), torch.float32)
    scaled = Attr(scales={capi.ARG_SRC: BOTH_DIMS})
    summed = Attr([("binary", "add", buf_md)])
    try:
        swap = create("rotary half", lambda pd: lib.reorder_primitive_desc_create(
            pd, x_half.handle, lib.engine, buf_half.handle, lib.engine, scaled.handle))
        table_md = MemDesc.of((rows, d), torch.float32)
        mix = create("rotary sum", lambda pd: lib.binary_primitive_desc_create(
            pd, lib.engine, capi.BINARY["mul"], x_md.handle, table_md.handle, x_md.handle, summed.handle))
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no reorder / binary for this node: {exc}", "dnnl")
    if swap.is_reference or mix.is_reference:
        return Decline(f"oneDNN offers only its reference kernels here ({swap.impl}, {mix.impl})", "dnnl")
    return DnnlRotary(swap, mix, (x_half, buf_half, x_md, buf_md, scales_md, table_md), tables, dtype,
                      resources, keep=(scaled, summed))


def _tables(shape, cos, sin, heads, resources):
    """(cos, -sin of the first halves, sin of the second halves) broadcast into x's memory order
    as ``[rows, D]`` float32 (the halves ``[rows, D / 2]``), shared with the model's other
    nodes of equal tables and layout."""
    probe = torch.empty(shape, dtype=torch.float32)
    view, c, s = rotary_views(probe, cos, sin, heads)
    d = view.shape[-1]
    if d % 2 or d == 0:
        return Decline(f"the rotated axis {d} is odd", "dnnl")
    rows = probe.numel() // d
    held = resources.shared.setdefault("rotary tables", [])
    for key, got in held:
        if key[0] == tuple(shape) and key[1] == heads and torch.equal(key[2], cos) and torch.equal(key[3], sin):
            return got
    full_cos = torch.empty(shape, dtype=torch.float32)
    full_sin = torch.empty(shape, dtype=torch.float32)
    rotary_views(full_cos, cos, sin, heads)[0].copy_(c.expand(view.shape))
    rotary_views(full_sin, cos, sin, heads)[0].copy_(s.expand(view.shape))
    full_sin = full_sin.view(rows, d)
    half = d // 2
    got = (full_cos.view(rows, d), (-full_sin[:, :half]).contiguous(), full_sin[:, half:].contiguous())
    held.append(((tuple(shape), heads, cos.clone(), sin.clone()), got))
    return got


class DnnlRotary:
    """The three calls, their memories pointed at this call's x and output when those change
    (arena views are the same objects on every run), the float32 buffer a temporary of the
    calling thread's buffer (``Resources.temporary``)."""
    writes_out = True
    reads = (0,)

    def __init__(self, swap, mix, mds, tables, dtype, resources, keep=()):
        x_half, buf_half, x_md, buf_md, scales_md, table_md = mds
        self.impl = mix.impl
        self._keep = (swap, mix, mds, tables, keep)
        self._lib = capi.load()
        self._rows, self._d = tables[0].shape
        self._half_bytes = (self._d // 2) * torch.empty((), dtype=dtype).element_size()
        self._dtype = dtype
        cos, sin_first, sin_second = tables
        # the second halves -> the buffer's first halves, then the first halves -> its second halves
        self._src = [Memory(x_half, 0), Memory(x_half, 0)]
        self._dst = [Memory(buf_half, 0), Memory(buf_half, 0)]
        self._scales = [Memory(scales_md, sin_first.data_ptr()), Memory(scales_md, sin_second.data_ptr())]
        self._x, self._y, self._buf = Memory(x_md, 0), Memory(x_md, 0), Memory(buf_md, 0)
        self._table = Memory(table_md, cos.data_ptr())
        self._calls = []
        for i in range(2):
            args = (ExecArg * 3)(ExecArg(capi.ARG_SRC, self._src[i].handle), ExecArg(capi.ARG_DST, self._dst[i].handle),
                                 ExecArg(capi.ARG_ATTR_SCALES | capi.ARG_SRC, self._scales[i].handle))
            self._calls.append((swap.handle, 3, args))
        args = (ExecArg * 4)(ExecArg(capi.ARG_SRC, self._x.handle), ExecArg(capi.ARG_SRC_1, self._table.handle),
                             ExecArg(capi.ARG_DST, self._y.handle),
                             ExecArg(capi.arg_post_op_src1(0), self._buf.handle))
        self._calls.append((mix.handle, 4, args))
        if swap.scratchpad_bytes or mix.scratchpad_bytes:
            raise ValueError("a rotary reorder or binary with a scratchpad")
        self._bound: tuple = (None, None)
        self._resources, self._bytes, self._tid = resources, 4 * self._rows * self._d, None
        resources.need(self._bytes)

    def __call__(self, x, cos=None, sin=None, out=None):
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype)
        if x.dtype != self._dtype or out.dtype != self._dtype or x.numel() != self._rows * self._d \
                or out.shape != x.shape or not x.is_contiguous() or not out.is_contiguous():
            raise TypeError(f"rotary embedding: x {x.dtype} {tuple(x.shape)}, output {out.dtype} "
                            f"{tuple(out.shape)}; the kernel was made for row-major {self._dtype} of "
                            f"{self._rows * self._d} values")
        if self._tid != threading.get_ident():
            self._thread()
        if self._bound[0] is not x or self._bound[1] is not out:
            p = x.data_ptr()
            self._src[0].point(p + self._half_bytes)
            self._src[1].point(p)
            self._x.point(p)
            self._y.point(out.data_ptr())
            self._bound = (x, out)
        stream, execute = thread_stream(), self._lib.execute
        for handle, n, args in self._calls:
            status = execute(handle, stream, n, args)
            if status:
                raise capi.DnnlError("execute rotary embedding", status)
        return out

    def _thread(self) -> None:
        """Point the float32 buffer's memories at this thread's temporary (no scratchpad: bytes 0 on)."""
        self._tid = threading.get_ident()
        b = self._resources.temporary(0, self._bytes).data_ptr()
        self._dst[0].point(b)
        self._dst[1].point(b + 4 * (self._d // 2))
        self._buf.point(b)
