"""oneDNN primitives: attributes (post-ops, user scratchpad), primitive descriptors and
primitives, and the per-thread resources a primitive runs with.

- ``attr(post_ops, fpmath_bf16=False, scales={}, zero_points={})``: a ``dnnl_primitive_attr_t``
  whose scratchpad is the caller's (never allocated by oneDNN during a run) and whose post-ops
  are, in order, ``("eltwise", name, alpha, beta)``, ``("sum", scale)`` (accumulate into the
  destination's current contents; ``("sum", scale, zero point, data type)`` reads them as
  quantised values: ``scale * (dst - zero point)``) or ``("binary", name, MemDesc)`` (a
  second tensor, given at run time); ``scales`` / ``zero_points`` map an argument
  (``capi.ARG_SRC`` ...) to the mask of its int8 quantisation parameters, whose values are
  execution arguments.
- ``Primitive(pd, what)``: owns a primitive descriptor and the primitive made from it (the
  JIT-generated code); ``impl`` names the implementation oneDNN chose (``"ref"`` ones are
  slow: callers decline them), ``md(query)`` its descriptors, ``scratchpad_bytes``.
- ``Resources``: what one model's primitives share per thread that runs them: a oneDNN stream
  and one scratchpad buffer sized for the largest primitive (``need``). A model's runs are
  serialised on its lock and each stream worker is one thread, so one buffer per thread is
  never used by two primitives at once.
- ``call_arguments(prim, pairs, resources)``: the prepared execution arguments of a kernel
  that points its memories at each call's tensors (one primitive per row count).
- ``row_pieces(rows)``: a row count as at most three pieces of a fixed set of counts, for a
  kernel whose rows are independent (a layer norm, an activation): it runs any row count on
  a bounded set of primitives, made once, instead of making code for every count it meets
  (a variable-length encoder meets a new one with most requests).
- ``reorder(src, src_ptr, dst, dst_ptr)``: one-off copies between layouts (weight packing and
  unpacking), on the calling thread's stream.
"""
from __future__ import annotations

import ctypes as C
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Callable

import torch

from . import capi
from .capi import check, vp
from .memory import Memory, MemDesc

_streams = threading.local()


def _lib():
    return capi.load()


def thread_stream() -> vp:
    """This thread's oneDNN stream (made at its first use)."""
    s = getattr(_streams, "stream", None)
    if s is None:
        s = vp()
        lib = _lib()
        check(lib.stream_create(C.byref(s), lib.engine, 1), "stream_create")
        _streams.stream = s
    return s


class Attr:
    __slots__ = ("handle", "_po", "_lib")

    def __init__(self, post_ops=(), fpmath_bf16: bool = False, scales=(), zero_points=()):
        lib = self._lib = _lib()
        self.handle, self._po = vp(), vp()
        check(lib.primitive_attr_create(C.byref(self.handle)), "primitive_attr_create")
        check(lib.primitive_attr_set_scratchpad_mode(self.handle, capi.SCRATCHPAD_USER), "set_scratchpad_mode")
        if fpmath_bf16:
            check(lib.primitive_attr_set_fpmath_mode(self.handle, capi.FPMATH_BF16), "set_fpmath_mode")
        for arg, mask in dict(scales).items():           # the values come at run time (ARG_ATTR_SCALES | arg)
            check(lib.primitive_attr_set_scales_mask(self.handle, arg, mask), "set_scales_mask")
        for arg, mask in dict(zero_points).items():      # (ARG_ATTR_ZERO_POINTS | arg), int32
            check(lib.primitive_attr_set_zero_points_mask(self.handle, arg, mask), "set_zero_points_mask")
        if post_ops:
            check(lib.post_ops_create(C.byref(self._po)), "post_ops_create")
            for op in post_ops:
                if op[0] == "eltwise":
                    check(lib.post_ops_append_eltwise(self._po, capi.ELTWISE[op[1]], op[2], op[3]), "append_eltwise")
                elif op[0] == "sum":      # ("sum", scale[, zero point, data type]): scale * (dst - zp)
                    zp, dt = (int(op[2]), int(op[3])) if len(op) > 3 else (0, 0)
                    check(lib.post_ops_append_sum(self._po, op[1], zp, dt), "append_sum")
                elif op[0] == "binary":
                    check(lib.post_ops_append_binary(self._po, capi.BINARY[op[1]], op[2].handle), "append_binary")
                else:
                    raise ValueError(f"unknown post-op {op[0]!r}")
            check(lib.primitive_attr_set_post_ops(self.handle, self._po), "set_post_ops")

    def __del__(self):
        try:
            if self._po:
                self._lib.post_ops_destroy(self._po)
            self._lib.primitive_attr_destroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Primitive:
    __slots__ = ("pd", "handle", "what", "impl", "scratchpad_bytes", "_lib")

    def __init__(self, pd: vp, what: str):
        self._lib = lib = _lib()
        self.pd, self.what = pd, what
        impl = C.c_char_p()
        check(lib.primitive_desc_query(pd, capi.Q_IMPL_INFO_STR, 0, C.byref(impl)), "query impl")
        self.impl = (impl.value or b"").decode("ascii", "replace")
        sp = lib.primitive_desc_query_md(pd, capi.Q_SCRATCHPAD_MD, 0)
        self.scratchpad_bytes = int(lib.memory_desc_get_size(sp)) if sp else 0
        self.handle = vp()
        check(lib.primitive_create(C.byref(self.handle), pd), f"primitive_create ({what})")

    def md(self, query: int, index: int = 0) -> MemDesc:
        h = self._lib.primitive_desc_query_md(self.pd, query, index)
        if not h:
            raise capi.DnnlError(f"{self.what} has no descriptor for query {query}", 2)
        return MemDesc.clone(h)

    @property
    def is_reference(self) -> bool:
        return self.impl.startswith("ref")

    def __del__(self):
        try:
            self._lib.primitive_destroy(self.handle)
            self._lib.primitive_desc_destroy(self.pd)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# implementations whose post-ops run oneDNN's JIT eltwise injector, whose NaN / Inf behaviour
# the EXACT tables of conv.py and linear.py were checked against (tests/runtime/test_nan_inf.py);
# other ones (the GEMM convolution's epilogue) map NaN to 0 in logistic, so exact kernels apply
# their activation after the primitive there
INJECTOR_IMPLS = ("brgconv", "brdgmm", "brg:", "jit:")


def exact_post_ops(impl: str) -> bool:
    """Whether the exact post-op tables hold for primitive implementation ``impl``."""
    return impl.startswith(INJECTOR_IMPLS)


def create(what: str, make) -> Primitive:
    """``make(pd_pointer) -> status``: the primitive descriptor's creation call."""
    pd = vp()
    check(make(C.byref(pd)), what)
    return Primitive(pd, what)


class Resources:
    """One model's per-thread stream and scratchpad (``need`` first, at kernel creation)."""

    def __init__(self):
        self.bytes = 0
        self._local = threading.local()
        self._held: list[torch.Tensor] = []      # every buffer handed out (kernels keep pointers)
        self.shared: dict = {}      # what the model's kernels share across nodes, by the kernels' own keys
                                    # (primitives that depend on a shape alone: thread-safe to execute)

    def need(self, nbytes: int) -> None:
        self.bytes = max(self.bytes, int(nbytes))

    def for_thread(self, nbytes: int) -> tuple[vp, Memory | None]:
        """This thread's stream and a scratchpad memory of at least ``nbytes`` (None for 0)."""
        loc = self._local
        buf = getattr(loc, "buf", None)
        if nbytes and (buf is None or buf.numel() < nbytes):
            with torch.inference_mode(False):
                buf = loc.buf = torch.empty(max(self.bytes, nbytes), dtype=torch.uint8)
            loc.mems = {}
            self._held.append(buf)
        mem = None
        if nbytes:
            mem = loc.mems.get(nbytes)
            if mem is None:
                mem = loc.mems[nbytes] = Memory(MemDesc.tagged([nbytes], capi.U8, capi.TAG_A), buf.data_ptr())
        return thread_stream(), mem

    @staticmethod
    def past_scratchpads(*prims: "Primitive") -> int:
        """The first cache-line-aligned byte of the thread's buffer past the scratchpads of
        ``prims``: where a temporary the kernel keeps between their calls may start."""
        top = max((p.scratchpad_bytes for p in prims), default=0)
        return (top + 63) // 64 * 64

    def temporary(self, offset: int, nbytes: int) -> torch.Tensor:
        """Bytes ``offset .. offset + nbytes`` of this thread's buffer, as uint8: a kernel's own
        temporary between two of its primitives, past their scratchpad bytes (``need(offset +
        nbytes)`` at kernel creation)."""
        self.for_thread(offset + nbytes)
        return self._local.buf[offset:offset + nbytes]


class PreparedCalls:
    """One thread's prepared calls of a kernel configuration whose primitive depends on a row
    count: ``make(rows)`` prepares one (its primitive, memories, argument array); the last
    ``kept`` row counts' are kept, the least recently used dropped first. Kernels of one
    configuration keep one per thread in ``Resources.shared`` and point the memories at their
    own tensors before each call."""

    def __init__(self, make: Callable[[int], tuple], kept: int):
        self.make, self.kept = make, kept
        self.rows: OrderedDict[int, tuple] = OrderedDict()

    def get(self, rows: int) -> tuple:
        got = self.rows.get(rows)
        if got is not None:
            self.rows.move_to_end(rows)
            return got
        got = self.rows[rows] = self.make(rows)
        while len(self.rows) > self.kept:
            self.rows.popitem(last=False)
        return got

    @staticmethod
    def of_thread(table: dict, make: Callable[[int], tuple], kept: int) -> "PreparedCalls":
        """This thread's prepared calls in a configuration's ``table`` (thread -> calls), made
        at its first call there: each thread has its own scratchpad and memories."""
        calls = table.get(threading.get_ident())
        if calls is None:
            calls = table[threading.get_ident()] = PreparedCalls(make, kept)
        return calls


PIECE_UNITS = (64, 8, 1)         # ``row_pieces``: a row count's digits in base 8 below 64, then its multiple of 64
PIECE_MOST = 1024                # ... of at most this many rows a piece


@lru_cache(maxsize=4096)
def row_pieces(rows: int) -> tuple[tuple[int, int], ...]:
    """``(first row, row count)`` pieces that cover ``rows`` rows in order: pieces of
    ``PIECE_MOST`` rows while more remain, then the rest's multiple of 64, of 8, and the last
    rows (``rows`` 201: 192, 8, 1). Every count is one of 16 multiples of 64, 7 of 8 or 7 below
    8, so a kernel of independent rows needs at most 30 primitives for any traffic, and runs
    a count in at most three calls (more only past ``PIECE_MOST``)."""
    pieces, start, rest = [], 0, int(rows)
    while rest > PIECE_MOST:
        pieces.append((start, PIECE_MOST))
        start, rest = start + PIECE_MOST, rest - PIECE_MOST
    for unit in PIECE_UNITS:
        n = rest - rest % unit
        if n:
            pieces.append((start, n))
            start, rest = start + n, rest - n
    return tuple(pieces)


def call_arguments(prim: Primitive, pairs, resources: Resources) -> tuple:
    """The execution arguments of ``prim`` prepared once, for a kernel that points some of their
    memories at its tensors before each call: ``pairs`` of (argument, ``Memory``), then this
    thread's scratchpad from ``resources`` (sized for ``prim`` first). Returns the ctypes
    array, its length and the scratchpad memory (kept alive with the array)."""
    resources.need(prim.scratchpad_bytes)
    _stream, scratch = resources.for_thread(prim.scratchpad_bytes)
    args = [capi.ExecArg(arg, mem.handle) for arg, mem in pairs]
    if scratch is not None:
        args.append(capi.ExecArg(capi.ARG_SCRATCHPAD, scratch.handle))
    return (capi.ExecArg * len(args))(*args), len(args), scratch


def reorder(src: MemDesc, src_ptr: int, dst: MemDesc, dst_ptr: int) -> None:
    """Copy the bytes at ``src_ptr`` (laid out as ``src``) to ``dst_ptr`` laid out as ``dst``,
    on the calling thread's stream (one-off work: weight packing and unpacking)."""
    lib = _lib()
    pd = vp()
    check(lib.reorder_primitive_desc_create(C.byref(pd), src.handle, lib.engine, dst.handle, lib.engine, None),
          "reorder_primitive_desc_create")
    prim = Primitive(pd, "reorder")
    a, b = Memory(src, src_ptr), Memory(dst, dst_ptr)
    args = (capi.ExecArg * 2)(capi.ExecArg(capi.ARG_SRC, a.handle), capi.ExecArg(capi.ARG_DST, b.handle))
    check(lib.execute(prim.handle, thread_stream(), 2, args), "reorder")
