"""``fusegraph::LayerNorm`` / ``fusegraph::SkipLayerNorm`` over the last axis as oneDNN layer
normalisation when the row count is known only at run time (a model with symbolic input dims:
a variable-length encoder, a decoder's one-row steps); ``layernorm.py`` is the kernel of a
node whose shapes are static.

oneDNN's layer normalisation takes no run-time dims, and a primitive made for a row count
costs a fraction of a millisecond of JIT code: made for every count, that was paid by most
requests of variable-length traffic. Rows are independent, so a call runs its rows as at
most three pieces of a fixed set of counts (``primitive.row_pieces``: 201 rows as 192, 8
and 1), each piece exactly the static kernel's rows of that count: the primitives are made
once, whatever the lengths. The nodes of a model with one configuration (width, output
type, parameters present, epsilon, mode) share them (``Resources.shared``); the calls of the
last ``ROWS_KEPT`` piece counts are kept, per thread (its scratchpad), with their argument
arrays; a call points their memories at the piece's rows and the node's parameters and
executes.

Semantics as ``layernorm.py``: SkipLayerNorm's sum ``s = a + b`` (broadcast by ATen) is written
into the second output when the node gives the residual stream, else into the normalised
output's own bytes, which the primitive normalises in place. Exact as the op's own kernel
(``ops/norm.layer_norm_exact``): where a row's statistics are not finite (a row with a NaN or
an Inf; a finite row of values near 1e37, whose float32 sum of squares overflows: oneDNN then
gives that row ``beta``, finite, so a check of the result alone misses it) the node is computed
again by the op's own kernel from the node's inputs, which recomputes such rows in float64. The
primitive is made in oneDNN's training mode for that: it writes each row's mean and variance
(into one per-thread buffer for all pieces), and one sum over the variances decides (finite
variances bound every result where ``sqrt(d) max|gamma| + max|beta|`` is a finite float32;
other parameters add a sum over the result). The fast form (``exact`` off: a guarded node whose
rows cannot overflow, or ``Config.fast_math``) is made for inference and checks nothing.
Float32 data, the normalised axis last and static, row-major tensors; the normalised output
float32, or bfloat16 (``out_dtype``) where it has its own bytes; gamma / beta float32 constants
of the last axis' size. Anything else declines with a reason (the planned-memory ATen kernel,
``cpu/layer_norm.py``, takes float32 nodes then).
Primitives of few elements are made for one thread (``threading_policy``), per piece count.
"""
from __future__ import annotations

import math
import threading

import torch

from .....ir.shape import broadcast_shapes
from ...protocol import Decline
from ..threading_policy import threads_for
from . import capi
from .layernorm import scale_and_shift
from .memory import MemDesc, Memory
from .primitive import Attr, PreparedCalls, Primitive, call_arguments, create, row_pieces, thread_stream

ROWS_KEPT = 32                   # piece counts whose prepared call a configuration keeps (``row_pieces`` makes 30 at most)
REFERENCE_ROWS = 64              # the row count of the bind-time primitive (its implementation is reported)
SERIAL_ELEMENTS = 1 << 13        # below this many elements a primitive is made for one thread
OUTPUT_TYPES = (torch.float32, torch.bfloat16)


def runtime_layer_norm_kernel(ctx, opdef, resources, exact: bool = True):
    """The kernel of a LayerNorm / SkipLayerNorm node whose rows are symbolic, or a ``Decline``
    saying why not."""
    node = ctx.node
    skip = node.op_type == "SkipLayerNorm"
    first = 2 if skip else 1                       # gamma, beta follow the data inputs
    data, y_v = node.inputs[:first], node.outputs[0]
    x_v = data[0]
    if any(v is None or v.dtype is None or v.dtype.to_torch() != torch.float32 for v in data) \
            or any(o.dtype is None or o.dtype.to_torch() != torch.float32 for o in node.outputs[1:]):
        return Decline("needs float32 data (and a float32 sum)", "dnnl")
    if x_v.shape is None or not x_v.shape or not isinstance(x_v.shape[-1], int) \
            or any(v.layout == "nhwc" for v in (*data, *node.outputs)) or int(node.attrs.get("axis", -1)) != -1:
        return Decline("needs row-major data whose normalised axis is the last and of known size", "dnnl")
    both = skip and len(node.outputs) == 2
    y_dtype = y_v.dtype.to_torch() if y_v.dtype is not None else None
    if y_dtype not in OUTPUT_TYPES or (y_dtype != torch.float32 and skip and not both):
        return Decline("writes float32, or bfloat16 from its own buffer (not over the sum)", "dnnl")
    d = int(x_v.shape[-1])
    params = scale_and_shift(ctx, first, d)
    if isinstance(params, Decline):
        return params
    kernel = RuntimeLayerNorm(d, y_dtype, *params, float(ctx.attr("epsilon")), resources,
                              opdef.build(ctx) if exact else None, skip, both)
    try:
        prim = kernel.make(REFERENCE_ROWS)
    except capi.DnnlError as exc:
        return Decline(f"oneDNN has no layer normalisation for this node: {exc}", "dnnl")
    if prim.is_reference:
        return Decline(f"oneDNN offers only its reference layer normalisation ({prim.impl})", "dnnl")
    kernel.impl = prim.impl
    return kernel


class RuntimeLayerNorm:
    """A layer norm of ``d``-wide rows, for inputs of any row count ``[..., d]``: ``kernel(x,
    gamma, beta, out=None)``, or for a skip node ``kernel(a, b, gamma, beta, out=None)``
    returning ``(y, s)`` where the node has both outputs. ``portable``: the op's own kernel,
    run again on a non-finite result (None: the fast form)."""
    writes_out = True
    reads = None                  # every input: the op's own kernel reads gamma and beta

    def __init__(self, d: int, y_dtype: torch.dtype, gamma, beta, eps: float, resources, portable,
                 skip: bool, both: bool):
        self.d, self.y_dtype, self.eps = d, y_dtype, eps
        self.portable, self.skip, self.both = portable, skip, both
        self._prop = capi.FORWARD_TRAINING if portable is not None else capi.FORWARD_INFERENCE
        reach = math.sqrt(d) * _largest(gamma, 1.0) + _largest(beta, 0.0)
        self._result_bounded = reach < torch.finfo(torch.float32).max    # finite statistics: a finite result
        self._params = tuple(t for t in (gamma, beta) if t is not None)     # kept alive: oneDNN reads them
        self._flags = (capi.USE_SCALE if gamma is not None else 0) | (capi.USE_SHIFT if beta is not None else 0)
        self._param_ptrs = tuple(t.data_ptr() for t in (gamma, beta) if t is not None)
        self._resources = resources
        # per thread, the prepared calls by row count, shared by the model's layer norms of this
        # configuration (each node points the parameters at its own)
        config = ("layer_normalization", d, y_dtype, self._prop, self._flags, eps)
        self._calls: dict[int, PreparedCalls] = resources.shared.setdefault(config, {})
        self._stats: dict[int, torch.Tensor] = resources.shared.setdefault((*config, "statistics"), {})  # per thread
        self._lib = capi.load()
        self._exec = self._lib.execute
        self.impl = "portable"

    def make(self, rows: int) -> Primitive:
        """The layer normalisation primitive of ``rows`` rows (row-major, ``y`` of the node's type)."""
        md = MemDesc.of((rows, self.d), torch.float32)
        y_md = MemDesc.of((rows, self.d), self.y_dtype)
        attr = Attr()
        with threads_for(rows * self.d < SERIAL_ELEMENTS):
            return create("layer_normalization", lambda pd: self._lib.layer_normalization_forward_primitive_desc_create(
                pd, self._lib.engine, self._prop, md.handle, y_md.handle, None, self.eps, self._flags,
                attr.handle))

    def _prepare(self, rows: int) -> tuple:
        """A prepared call for a piece of ``rows`` rows: the primitive, its source,
        destination, parameter memories and in training mode its mean and variance memories
        (all pointed at a piece's tensors before each call), and the argument array."""
        prim = self.make(rows)
        if prim.is_reference:
            raise RuntimeError(f"oneDNN has only its reference layer normalisation for {rows} rows of {self.d}")
        x = Memory(MemDesc.of((rows, self.d), torch.float32), 0)
        y = Memory(MemDesc.of((rows, self.d), self.y_dtype), 0)
        stat = MemDesc.of((self.d,), torch.float32)
        params = tuple(Memory(stat, ptr) for ptr in self._param_ptrs)
        args = [a for a, flag in ((capi.ARG_SCALE, capi.USE_SCALE), (capi.ARG_SHIFT, capi.USE_SHIFT))
                if self._flags & flag]
        pairs = [(capi.ARG_SRC, x), (capi.ARG_DST, y)] + list(zip(args, params))
        stats = ()
        if self._prop == capi.FORWARD_TRAINING:        # each row's mean and variance, for the exactness check
            stats = (Memory(MemDesc.of((rows,), torch.float32), 0), Memory(MemDesc.of((rows,), torch.float32), 0))
            pairs += [(capi.ARG_MEAN, stats[0]), (capi.ARG_VARIANCE, stats[1])]
        arg_array, nargs, scratch = call_arguments(prim, pairs, self._resources)
        return prim, x, y, params, stats, arg_array, nargs, (scratch, pairs)

    def _statistics(self, rows: int) -> torch.Tensor:
        """This thread's buffer of ``rows`` means, then ``rows`` variances (training mode)."""
        ident = threading.get_ident()
        buf = self._stats.get(ident)
        if buf is None or buf.shape[1] < rows:
            with torch.inference_mode(False):
                buf = self._stats[ident] = torch.empty(2, max(rows, REFERENCE_ROWS))
        return buf

    def _normalise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """The norm of ``x``'s rows written into ``y`` (in place where they are one tensor), a
        piece of rows a call (``row_pieces``); returns the rows' variances (training mode;
        else None)."""
        if x.shape[-1] != self.d:
            raise ValueError(f"oneDNN layer normalisation: input {tuple(x.shape)} does not end in {self.d}")
        rows = x.numel() // self.d if self.d else 0
        if rows == 0:
            return None
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.to(torch.float32).contiguous()
        target = y if y.is_contiguous() and y.dtype == self.y_dtype else torch.empty(y.shape, dtype=self.y_dtype)
        training = self._prop == capi.FORWARD_TRAINING
        buf = self._statistics(rows) if training else None
        x_ptr, y_ptr, stride = x.data_ptr(), target.data_ptr(), buf.stride(0) * 4 if training else 0
        x_row, y_row = self.d * 4, self.d * target.element_size()
        calls = PreparedCalls.of_thread(self._calls, self._prepare, ROWS_KEPT)
        for start, count in row_pieces(rows):
            prim, xm, ym, params, stats, args, nargs, _kept = calls.get(count)
            xm.point(x_ptr + start * x_row)
            ym.point(y_ptr + start * y_row)
            for mem, ptr in zip(params, self._param_ptrs):
                mem.point(ptr)
            if training:
                stats[0].point(buf.data_ptr() + start * 4)
                stats[1].point(buf.data_ptr() + stride + start * 4)
            status = self._exec(prim.handle, thread_stream(), nargs, args)
            if status:
                raise capi.DnnlError("execute layer normalisation", status)
        if target is not y:
            y.copy_(target)
        return buf[1, :rows] if training else None

    def _exact(self, y: torch.Tensor, variances: torch.Tensor | None, args: tuple) -> None:
        """The op's own kernel again on ``args`` (the node's inputs) where a row's variance is
        not finite, or (unbounded parameters) the result holds a NaN or an infinity
        (``layer_norm_exact`` recomputes such rows in float64)."""
        if variances is None:                 # the fast form, or no rows
            return
        if math.isfinite(float(variances.sum())) and (self._result_bounded or math.isfinite(float(y.sum()))):
            return
        got = self.portable(*args)
        y.copy_(got[0] if self.both else got)

    def __call__(self, *args, out=None):
        if self.skip:
            return self._skip_norm(*args, out=out)
        x = args[0]
        y = torch.empty(x.shape, dtype=self.y_dtype) if out is None else out
        self._exact(y, self._normalise(x, y), args)
        return y

    def _skip_norm(self, a, b, *params, out=None):
        if out is None:
            shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))   # torch's imports sympy
            y = torch.empty(shape, dtype=self.y_dtype)
            out = (y, torch.empty(shape)) if self.both else y
        y, s = (out[0], out[1]) if self.both else (out, out)
        torch.add(a, b, out=s)
        variances = self._normalise(s, y)   # in place over s when the node has one output
        self._exact(y, variances, (a, b, *params))
        return (y, s) if self.both else y


def _largest(t: torch.Tensor | None, absent: float) -> float:
    """``max |t|`` (inf where ``t`` holds a NaN or an infinity); ``absent`` for no tensor."""
    if t is None:
        return absent
    if not t.numel():
        return 0.0
    m = float(t.abs().max())
    return m if math.isfinite(m) else math.inf
