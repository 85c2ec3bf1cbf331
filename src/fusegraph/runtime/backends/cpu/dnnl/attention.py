"""``fusegraph::ScaledDotProductAttention`` as oneDNN primitives: ``softmax(q @ k^T * scale +
mask) @ v`` in four calls, its temporaries in the thread's scratch buffer.

1. one reorder per operand (one for all three when q, k and v are packed along the last axis
   with equal widths, ``qkv_split``): the heads of ``[B, S, H*D]`` (or a 4-D operand) into a
   contiguous ``[B, H, S, D]`` buffer, where oneDNN's brgemm matmul runs (on strided heads it
   offers only its slower GEMM). A CPU where oneDNN has no brgemm matmul for the type at all
   (``brgemm_matmul``: AVX2 without AVX-512) runs the two products on its GEMM, the best
   matmul oneDNN has there, and faster than the op's own kernel;
2. the scores ``q @ k^T`` (k read transposed from its buffer) with the scale (``eltwise
   linear``) and the mask (``binary add``) as post-ops: accumulated in float32, rounded once;
3. the softmax (``softmax_accurate``) in place over the scores;
4. ``p @ v`` written straight into the planned output, heads merged (``merge_heads``) by
   the destination's strides.

Grouped-query attention (``kv_repeat`` n: k and v have H / n heads, each serving n consecutive
query heads) runs the same four calls: step 1 reads each k / v head n times (a stride-0 axis
in the reorder's source) into the places of its n query heads in the contiguous buffer that
step 1 fills for every attention, so no repeated k / v exists outside that per-thread buffer
and no kernel is added. (oneDNN 3.2's brgemm matmul that would broadcast k / v over the group
takes neither the mask post-op nor the merged-heads output; it falls back to ``ref`` / GEMM.)

A batch of several items (a window attention's windows) runs the calls once per *group* of
items: the primitives are made for ``group`` items, the largest divisor of the batch whose
buffers fit ``GROUP_BYTES``, so many small attentions make few calls and share the threads.
oneDNN's brgemm takes a mask that broadcasts over heads or rows but not one that broadcasts
over the batch (it falls back to its reference matmul), so such a mask, when it is a constant
(a relative-position bias), is expanded over the group once at bind; a mask that varies per
run and broadcasts over the batch runs one item per call. NaN and Inf: a
row with a NaN or +inf score, or only -inf scores, gives NaN, as ONNX's softmax does;
``nan_to_zero`` then zeroes NaN in the probabilities with torch, as the op's own kernel does. Made for one thread under ``SERIAL_MACS`` multiply-adds. Anything else declines
with its reason (dynamic shapes, broadcast batch dims, mixed types, strided operands): the op's
own kernel runs it.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from ...protocol import Decline
from ..threading_policy import SERIAL_MACS, threads_for
from . import capi
from .capi import ExecArg
from .compute import matmul_implementation
from .layouts import contiguous, dtype_of, static_shape, strides_of
from .memory import MemDesc, Memory
from .primitive import Attr, create

TYPES = (torch.float32, torch.bfloat16)
ALIGN = 64
GROUP_BYTES = 4 << 20      # the most bytes of heads, scores (and an expanded mask) one call's group of items takes


def brgemm_matmul(dtype: torch.dtype) -> bool:
    """Whether oneDNN has its brgemm matmul for ``dtype`` on this CPU: a batched product of
    contiguous operands, an attention's scores, gets it (AVX-512 and up); without (AVX2 only),
    its GEMM is the fastest matmul it offers."""
    return (matmul_implementation(dtype, (2, 64, 64)) or "").startswith("brg")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _operand(node, which: int, split, heads: int, k_transposed: bool):
    """(input index, element offset, [B, H, S, D] shape, strides) of q / k / v (0 / 1 / 2), or a
    reason string."""
    index = 0 if split is not None else which
    v = node.inputs[index]
    shape = static_shape(v)
    if shape is None:
        return "needs static shapes"
    if strides_of(v) != contiguous(shape):
        return "needs row-major operands"
    if split is not None or heads:
        if len(shape) != 3 or not heads:
            return "a packed operand without its head count"
        width = shape[2]
        offset, size = (sum(split[:which]), split[which]) if split is not None else (0, width)
        if size % heads:
            return "an operand's width is not a multiple of its heads"
        d = size // heads
        return index, offset, (shape[0], heads, shape[1], d), (shape[1] * width, d, width, 1)
    if len(shape) != 4:
        return "needs 4-D operands or a head count"
    st = contiguous(shape)
    if which == 1 and k_transposed:          # [B, H, D, S] read as [B, H, S, D]
        b, h, d, s = shape
        return index, 0, (b, h, s, d), (st[0], st[1], 1, s)
    return index, 0, shape, st


def attention_kernel(ctx, resources):
    node = ctx.node
    split = ctx.attr("qkv_split", None)
    split = None if split is None else [int(n) for n in split]
    heads = [int(ctx.attr(f"{t}_heads", 0)) for t in "qkv"]
    k_transposed = bool(ctx.attr("k_transposed", 0)) and not heads[1]
    ops = [_operand(node, i, split, heads[i], k_transposed) for i in range(3)]
    for o in ops:
        if isinstance(o, str):
            return Decline(o, "dnnl")
    dtype = dtype_of(node.inputs[0])
    if dtype not in TYPES or any(dtype_of(node.inputs[o[0]]) != dtype for o in ops):
        return Decline(f"needs float32 or bfloat16 q, k and v of one type (got {dtype})", "dnnl")
    (_, _, qs, _), (_, _, ks, _), (_, _, vs, _) = ops
    rep = int(ctx.attr("kv_repeat", 1))
    if not (qs[0] == ks[0] == vs[0] and qs[1] == ks[1] * rep == vs[1] * rep and qs[3] == ks[3] and ks[2] == vs[2]):
        return Decline(f"operands {qs}, {ks}, {vs} broadcast or do not chain", "dnnl")
    b, h, length, d = qs
    s_len, dv = ks[2], vs[3]
    y_v = node.outputs[0]
    ys = static_shape(y_v)
    merge = bool(ctx.attr("merge_heads", 0))
    want = (b, length, h * dv) if merge else (b, h, length, dv)
    if ys != want or dtype_of(y_v) != dtype or strides_of(y_v) != contiguous(ys):
        return Decline(f"output {ys} is not the row-major {want} of the operands' type", "dnnl")
    mask_v = node.inputs[3] if len(node.inputs) > 3 else None
    ms = None
    if mask_v is not None:
        ms = static_shape(mask_v)
        if ms is None or len(ms) > 4 or strides_of(mask_v) != contiguous(ms) \
                or dtype_of(mask_v) not in (dtype, torch.float32):
            return Decline("needs a static row-major float32 or operand-type mask", "dnnl")
        ms = (1,) * (4 - len(ms)) + tuple(ms)
        if any(m not in (1, t) for m, t in zip(ms, (b, h, length, s_len))):
            return Decline(f"the mask {ms} does not broadcast into the scores", "dnnl")
    dims = (b, h, length, s_len, d, dv)
    reason = None
    for group in dict.fromkeys((_group(dims, dtype, mask_v, ms), 1)):
        try:
            mask = None if mask_v is None else _mask(ctx, dtype_of(mask_v), ms, group)
            return DnnlAttention(ctx, resources, ops, dtype, split, dims, merge, mask, rep, group)
        except capi.DnnlError as exc:
            reason = f"oneDNN has no primitives for this attention: {exc}"
        except NoFastForm as exc:
            reason = str(exc)
    return Decline(reason, "dnnl")


def _group(dims, dtype, mask_v, ms) -> int:
    """How many batch items one call takes: the largest divisor of the batch whose buffers
    (heads, scores and a mask expanded over the group) fit ``GROUP_BYTES``."""
    b, h, length, s_len, d, dv = dims
    es = torch.empty((), dtype=dtype).element_size()
    item = h * (length * d + s_len * d + s_len * dv + length * s_len) * es
    if mask_v is not None and ms[0] == 1:
        item += ms[1] * ms[2] * ms[3] * torch.empty((), dtype=dtype_of(mask_v)).element_size()
    fits = [g for g in range(1, b + 1) if b % g == 0 and g * item <= GROUP_BYTES]
    return fits[-1] if fits else 1


def _mask(ctx, mask_dtype, ms, group: int):
    """(memory descriptor for one call, type, elements from one call's mask to the next, the
    constant expanded over the group or None); ``NoFastForm`` where a mask of batch one that is
    not a constant would have to broadcast over the group."""
    if ms[0] > 1 or group == 1:
        step = group * ms[1] * ms[2] * ms[3] if ms[0] > 1 else 0
        return MemDesc.of((group if ms[0] > 1 else 1, *ms[1:]), mask_dtype), mask_dtype, step, None
    const = ctx.const(3)
    if const is None or const.device.type != "cpu":
        raise NoFastForm("a mask that broadcasts over the batch and is not a constant")
    expanded = const.to(mask_dtype).reshape(ms).expand(group, *ms[1:]).contiguous()
    return MemDesc.of(tuple(expanded.shape), mask_dtype), mask_dtype, 0, expanded


class HeadsCopy(NamedTuple):
    """One reorder of operand heads into their contiguous buffer."""
    prim: object            # the reorder primitive
    index: int              # the node input it reads
    offset: int             # bytes into that input (q, k or v of a packed input)
    src: Memory             # the input's heads, one call's batch items (pointed per call)
    dst: Memory             # the contiguous buffer (pointed per thread)
    first: int              # the first operand it copies: 0 / 1 / 2 (q / k / v)


class NoFastForm(Exception):
    """oneDNN offers only slow forms for a primitive (reference, or GEMM where it has brgemm)."""


class DnnlAttention:
    """The four calls of one attention node; ``__call__(*inputs it reads, out=)``."""
    writes_out = True

    def __init__(self, ctx, resources, ops, dtype, split, dims, merge: bool, mask, rep: int = 1, group: int = 1):
        batch, h, length, s_len, d, dv = dims
        b = group             # the primitives take ``group`` batch items; a call runs them per group
        mask_md, self.mask_dtype, mask_step, self.mask_const = mask if mask is not None else (None, None, 0, None)
        lib = capi.load()
        self.es = es = torch.empty((), dtype=dtype).element_size()
        scale = float(ctx.attr("scale", 1.0))
        self.nan_to_zero = bool(ctx.attr("nan_to_zero", 0))
        self.reads = tuple(i for i, v in enumerate(ctx.node.inputs) if v is not None)
        self.out_shape = (batch, length, h * dv) if merge else (batch, h, length, dv)
        self.group, self.calls_per_run = group, batch // group
        mask_es = torch.empty((), dtype=self.mask_dtype).element_size() if mask is not None else 0
        # bytes from one group of items to the next: per operand source, in the output, in the mask
        self.steps = ([o[3][0] * group * es for o in ops], group * length * h * dv * es, mask_step * mask_es)
        self.dtype, self.resources = dtype, resources
        shapes = [(b, h, length, d), (b, h, s_len, d), (b, h, s_len, dv)]
        sizes = [_align(b * h * x * y * es) for _, _, x, y in shapes]
        self.heads_at = [sum(sizes[:i]) for i in range(3)]      # byte offsets after the scratchpads
        self.scores_at = sum(sizes)
        self.scores_shape = (b, h, length, s_len)
        scores_md = MemDesc.of(self.scores_shape, dtype)
        q_md, v_md = MemDesc.of(shapes[0], dtype), MemDesc.of(shapes[2], dtype)
        kt_md = MemDesc.of((b, h, d, s_len), dtype, (h * s_len * d, s_len * d, 1, d))   # k's buffer, transposed
        out_md = MemDesc.of((b, h, length, dv), dtype,
                            (length * h * dv, dv, h * dv, 1) if merge else contiguous((b, h, length, dv)))
        self.rep = rep
        post = [("eltwise", "linear", scale, 0.0)] if scale != 1.0 else []
        self.mask_arg = capi.arg_post_op_src1(len(post)) if mask_md is not None else None
        post += [("binary", "add", mask_md)] if mask_md is not None else []
        # q, k and v side by side in one reorder, when their buffers are as long as they are aligned
        packed = split is not None and len(set(split)) == 1 and sizes[0] == b * h * length * d * es
        attrs = [Attr(post), Attr(), Attr()]
        with threads_for(b * h * length * s_len * (d + dv) < SERIAL_MACS):
            self.reorders = [self._reorder(lib, ops, dtype, first, n)
                             for first, n in ([(0, 3)] if packed else [(0, 1), (1, 1), (2, 1)])]
            self.qk = create("attention scores", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, q_md.handle, kt_md.handle, None, scores_md.handle, attrs[0].handle))
            self.softmax = create("attention softmax", lambda pd: lib.softmax_forward_primitive_desc_create(
                pd, lib.engine, capi.FORWARD_INFERENCE, capi.SOFTMAX_ACCURATE, scores_md.handle,
                scores_md.handle, 3, attrs[1].handle))
            self.pv = create("attention output", lambda pd: lib.matmul_primitive_desc_create(
                pd, lib.engine, scores_md.handle, v_md.handle, None, out_md.handle, attrs[2].handle))
        prims = [r.prim for r in self.reorders] + [self.qk, self.softmax, self.pv]
        # a GEMM product is the slow form only where a brgemm one exists for the type
        slow = [p.impl for p in prims if p.is_reference] + [p.impl for p in (self.qk, self.pv)
                                                           if not p.impl.startswith("brg") and brgemm_matmul(dtype)]
        if slow:
            raise NoFastForm(f"oneDNN offers only {', '.join(slow)} for this attention")
        self.impl = self.qk.impl
        self.scratch = _align(max(p.scratchpad_bytes for p in prims))
        self.scores_bytes = b * h * length * s_len * es
        self.nbytes = self.scratch + self.scores_at + self.scores_bytes
        resources.need(self.nbytes)
        self.q, self.kt, self.v = Memory(q_md, 0), Memory(kt_md, 0), Memory(v_md, 0)   # the head buffers
        self.scores = Memory(scores_md, 0)
        self.mask = Memory(mask_md, 0) if mask_md is not None else None
        self.out = Memory(out_md, 0)
        self._keep = (q_md, kt_md, scores_md, v_md, out_md, mask_md, attrs)
        self._exec = lib.execute
        self._tid = None
        self._calls = self._pv = self._stream = self._scores_t = None

    def _reorder(self, lib, ops, dtype, first: int, n: int) -> HeadsCopy:
        """The copy of ``n`` operands' heads (three side by side when packed) into their buffers."""
        index, offset, shape, strides = ops[first]
        shape = (self.group, *shape[1:])          # one call's batch items
        if n == 3:          # q, k, v as one more leading axis, ``split[0]`` elements apart
            shape, strides = (3, *shape), (ops[1][1] - ops[0][1], *strides)
        if first and self.rep > 1:       # each k / v head read rep times (stride 0) into rep query heads' places
            shape = (shape[0], shape[1], self.rep, *shape[2:])
            strides = (strides[0], strides[1], 0, *strides[2:])
        src, dst = MemDesc.of(shape, dtype, strides), MemDesc.of(shape, dtype)
        attr = Attr()
        prim = create("attention heads", lambda pd: lib.reorder_primitive_desc_create(
            pd, src.handle, lib.engine, dst.handle, lib.engine, attr.handle))
        return HeadsCopy(prim, index, offset * self.es, Memory(src, 0), Memory(dst, 0), first)

    def _thread(self) -> None:
        """Point the temporaries at this thread's buffer and prepare the argument arrays."""
        self._tid = threading.get_ident()
        self._stream, scratch = self.resources.for_thread(self.nbytes)
        tail = scratch.ptr + self.scratch
        for mem, at in zip((self.q, self.kt, self.v), self.heads_at):
            mem.point(tail + at)
        self.scores.point(tail + self.scores_at)
        self._scores_t = self.resources.temporary(self.scratch + self.scores_at, self.scores_bytes) \
            .view(self.dtype).view(self.scores_shape)
        sp = ExecArg(capi.ARG_SCRATCHPAD, scratch.handle)
        calls = []
        for r in self.reorders:
            r.dst.point(tail + self.heads_at[r.first])
            calls.append((r.prim, _args([ExecArg(capi.ARG_SRC, r.src.handle), ExecArg(capi.ARG_DST, r.dst.handle), sp])))
        qk = [ExecArg(capi.ARG_SRC, self.q.handle), ExecArg(capi.ARG_WEIGHTS, self.kt.handle),
              ExecArg(capi.ARG_DST, self.scores.handle), sp]
        if self.mask is not None:
            qk.append(ExecArg(self.mask_arg, self.mask.handle))
        calls.append((self.qk, _args(qk)))
        calls.append((self.softmax, _args([ExecArg(capi.ARG_SRC, self.scores.handle),
                                           ExecArg(capi.ARG_DST, self.scores.handle), sp])))
        self._calls = calls
        self._pv = (self.pv, _args([ExecArg(capi.ARG_SRC, self.scores.handle),
                                    ExecArg(capi.ARG_WEIGHTS, self.v.handle),
                                    ExecArg(capi.ARG_DST, self.out.handle), sp]))

    @staticmethod
    def _check(t: torch.Tensor, what: str, dtype: torch.dtype) -> torch.Tensor:
        if t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
            raise TypeError(f"oneDNN attention: {what} is {t.dtype} {tuple(t.shape)} on {t.device}, "
                            f"expected a contiguous CPU {dtype} tensor")
        return t

    def __call__(self, *ts, out=None):
        if self._tid != threading.get_ident():
            self._thread()
        given = dict(zip(self.reads, ts))
        sources = [self._check(given[r.index], "an operand", self.dtype).data_ptr() + r.offset for r in self.reorders]
        mask = 0 if self.mask is None else self.mask_const.data_ptr() if self.mask_const is not None else \
            self._check(given[3], "the mask", self.mask_dtype).data_ptr()
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.dtype)
        elif tuple(out.shape) != self.out_shape or out.dtype != self.dtype or not out.is_contiguous():
            raise TypeError(f"oneDNN attention: output {out.dtype} {tuple(out.shape)}, expected a contiguous "
                            f"{self.dtype} {self.out_shape}")
        steps_in, step_out, step_mask = self.steps
        dst = out.data_ptr()
        for call in range(self.calls_per_run):
            for r, src in zip(self.reorders, sources):
                r.src.point(src + call * steps_in[r.first])
            if self.mask is not None:
                self.mask.point(mask + call * step_mask)
            self.out.point(dst + call * step_out)
            for prim, args in self._calls:
                self._execute(prim, args)
            if self.nan_to_zero:
                torch.nan_to_num_(self._scores_t, nan=0.0)   # a probability is never +-inf: only NaN changes
            self._execute(*self._pv)
        return out

    def _execute(self, prim, args) -> None:
        status = self._exec(prim.handle, self._stream, len(args), args)
        if status:
            raise capi.DnnlError(f"execute {prim.what}", status)


def _args(items):
    arr = (ExecArg * len(items))()
    for i, a in enumerate(items):
        arr[i] = a
    return arr
