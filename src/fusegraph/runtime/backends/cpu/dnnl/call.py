"""``DnnlKernel``: one oneDNN primitive bound as a node's kernel, called from generated code.

A kernel is made once at bind time: the primitive (created for the layouts its tensors will
have), its constant arguments (blocked weights, bias) bound once, and ``Slot``s for the
tensors that change per call. The generated line is ``k(x, z, out=a3)``: it passes only the
node inputs the kernel reads at run time (``reads``: weights are not among them, so nothing
but the kernel holds them) and the output's planned arena view.

The hot path: when every tensor is the same object as at the previous call (arena views are
the same objects on every run), it executes the prepared argument array and returns; a new
tensor is checked against its slot (dtype, shape, strides) and its pointer given to the
memory object, or, when its layout differs, copied into a staging buffer of the primitive's
layout that the slot keeps for its life (a graph input in NCHW for a channels-last
convolution: by oneDNN's reorder where one moves every bit, checked once when it is made
(AVX2's bfloat16 reorder flushes subnormals: not used), else ATen's ``copy_``, which also
converts a type; ``converted`` counts such copies). An output view with other strides gets a
scratch result copied into it. Without ``out`` (probe and debug runs, memory "off") the
kernel allocates its result in the layout it was made for, and keeps no reference to that
call's tensors (the bind-time probe's would otherwise stay alive until the first run).

``prefill``: the input that a ``sum`` post-op accumulates onto; it lives in the output's
bytes when the planner put the output in place over it, else it is copied there first.
``after(result, inputs)``: torch work on the result in place (an activation whose oneDNN
post-op is not exact on NaN / Inf; a max pool's NaN check). The primitive runs on the calling thread's stream and scratchpad
(``primitive.Resources``).

``direct(tensors, out)``: a call whose tensors are the same on every run (arena views) and
that needs none of the above per call (no staging, no copy, no prefill copy, no ``after``)
as a ``DirectCall``: the generated code executes the kernel's argument array itself
(``runtime/direct.py``), without this Python path (microseconds a call, more when a large
kernel has just evicted the interpreter's data from the caches: benchmarks/RESULTS.md,
"direct calls"). Those tensors become
the kernel's *home*: a call through this path with other tensors (a profiling tool's) points
the slots back at them after it, so the array always holds the home pointers between calls.
"""
from __future__ import annotations

import ctypes as C
import operator
import threading
from typing import Callable

import torch

from ...protocol import Direct
from . import capi
from .capi import ExecArg
from .layouts import same_layout
from .memory import Memory, MemDesc
from .primitive import Primitive, Resources, thread_stream

_get_ident = threading.get_ident
_is_not = operator.is_not


def _convertible(t: torch.Tensor, slot: "Slot") -> bool:
    """A tensor the slot can take through its staging buffer: its shape, on the CPU, and the
    slot's dtype or another float one (float16 storage computed in float32)."""
    return (tuple(t.shape) == slot.shape and t.device.type == "cpu"
            and (t.dtype == slot.dtype or (t.dtype.is_floating_point and slot.dtype.is_floating_point)))


class _Reorder:
    """oneDNN's reorder from one layout of a slot's tensor into the slot's staging buffer: a
    pure data movement (bit for bit ``copy_``), faster than ATen's for a channels-last copy of
    an NCHW image (benchmarks/RESULTS.md, "where the rest of the gap is", item 3)."""
    __slots__ = ("prim", "src", "dst", "args", "_exec")

    def __init__(self, prim: Primitive, src: Memory, dst: Memory):
        self.prim, self.src, self.dst = prim, src, dst
        self._exec = capi.load().execute
        self.args = (ExecArg * 2)(ExecArg(capi.ARG_SRC, src.handle), ExecArg(capi.ARG_DST, dst.handle))

    @classmethod
    def make(cls, shape, strides, dtype, staging: torch.Tensor) -> "_Reorder | None":
        if any(st == 0 and n > 1 for st, n in zip(strides, shape)):   # a broadcast view: copy_ expands it
            return None
        lib = capi.load()
        src_md, dst_md = MemDesc.of(shape, dtype, strides), MemDesc.of(shape, dtype, tuple(staging.stride()))
        pd = capi.vp()
        if lib.reorder_primitive_desc_create(C.byref(pd), src_md.handle, lib.engine, dst_md.handle, lib.engine,
                                             None) != 0:
            return None
        prim = Primitive(pd, "staging reorder")
        if prim.scratchpad_bytes or prim.is_reference:     # no run-time allocation; no slow path
            return None
        made = cls(prim, Memory(src_md, 0), Memory(dst_md, staging.data_ptr()))
        return made if made._moves_every_bit(shape, strides, dtype, staging) else None

    def _moves_every_bit(self, shape, strides, dtype, staging: torch.Tensor) -> bool:
        """One reorder of random bit patterns (NaN payloads, subnormals, infinities): some
        implementations convert through float32 with subnormals flushed (AVX2's bfloat16 one
        makes a subnormal -0), and a staging copy must not change a value."""
        ints = {2: torch.int16, 4: torch.int32}.get(torch.empty((), dtype=dtype).element_size())
        if ints is None:
            return False
        info = torch.iinfo(ints)
        src = torch.empty_strided(shape, strides, dtype=ints)
        src.copy_(torch.randint(info.min, info.max, shape, dtype=ints, generator=torch.Generator().manual_seed(0)))
        self(src.view(dtype))
        return torch.equal(staging.view(ints), src)

    def __call__(self, t: torch.Tensor) -> None:
        self.src.point(t.data_ptr())
        status = self._exec(self.prim.handle, thread_stream(), 2, self.args)
        if status:
            raise capi.DnnlError("execute staging reorder", status)


class Slot:
    """A run-time tensor argument: its oneDNN argument index and the geometry it must have."""
    __slots__ = ("arg", "shape", "strides", "dtype", "memory", "_staging", "_reorders")

    def __init__(self, arg: int, shape, strides, dtype: torch.dtype, md: MemDesc | None = None):
        self.arg, self.shape, self.strides, self.dtype = arg, tuple(shape), tuple(strides), dtype
        self.memory = Memory(md or MemDesc.of(self.shape, dtype, self.strides), 0)
        self._staging = None
        self._reorders: dict[tuple, _Reorder | None] = {}    # source strides -> its reorder

    def empty(self) -> torch.Tensor:
        size = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return torch.empty(max(size, 1), dtype=self.dtype).as_strided(self.shape, self.strides)

    def staging(self) -> torch.Tensor:
        """A buffer of this slot's layout kept for the kernel's life: a tensor of another layout
        (a graph input in NCHW for a channels-last convolution) is copied into it on each call."""
        if self._staging is None:
            with torch.inference_mode(False):     # a normal tensor: written in any mode
                self._staging = self.empty()
        return self._staging

    def stage(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` copied into the staging buffer: by oneDNN's reorder when only the layout
        differs, else by ``copy_`` (which also converts a float type)."""
        fixed = self.staging()
        if t.dtype == self.dtype:
            key = tuple(t.stride())
            if key not in self._reorders:
                self._reorders[key] = _Reorder.make(self.shape, key, self.dtype, fixed)
            reorder = self._reorders[key]
            if reorder is not None:
                reorder(t)
                return fixed
        fixed.copy_(t)
        return fixed

    def fits(self, t: torch.Tensor) -> bool:
        return t.dtype == self.dtype and t.device.type == "cpu" and same_layout(t, self.shape, self.strides)


class DnnlKernel:
    writes_out = True

    def __init__(self, prim: Primitive, inputs: list[Slot], output: Slot, consts: list[tuple[int, Memory]],
                 resources: Resources, reads: tuple[int, ...], *, prefill: int | None = None,
                 after: Callable | None = None, keep: tuple = ()):
        self.prim, self.inputs, self.output = prim, inputs, output
        self.reads, self.prefill, self.after = reads, prefill, after
        self._keep = keep                         # the tensors behind ``consts`` (weights, bias)
        self._consts = consts
        self._resources = resources
        resources.need(prim.scratchpad_bytes)
        self._run_slots = [s for s in inputs if s is not None] + [output]
        self._n = len(self._run_slots) + len(consts) + (1 if prim.scratchpad_bytes else 0)
        self._args = (ExecArg * self._n)()
        for i, s in enumerate(self._run_slots):
            self._args[i] = ExecArg(s.arg, s.memory.handle)
        for j, (arg, mem) in enumerate(consts):
            self._args[len(self._run_slots) + j] = ExecArg(arg, mem.handle)
        self._cur: list = [None] * (len(inputs) + 1)
        self._tid = None
        self._stream = None
        self._scratch = None
        self._exec = capi.load().execute
        self._handle = prim.handle
        self.converted = 0                        # calls that copied a tensor into the primitive's layout
        self._prefill_copy = False                # the summand is not already in the output's bytes
        self._home: tuple | None = None           # (tensors, out) of the direct call, once made
        self.slow: str | None = None              # why a slow implementation runs (reported), if one does

    @property
    def impl(self) -> str:
        return self.prim.impl

    def direct(self, ts: tuple, out) -> Direct | None:
        """This call with the fixed tensors ``ts`` and ``out`` as a ``Direct`` (they become the
        kernel's home), or None where it needs the Python path on every call, or the kernel
        already has another home."""
        if self.after is not None or not isinstance(out, torch.Tensor) or len(ts) != len(self.inputs):
            return None
        if self.prefill is not None:              # the summand must already be the output's bytes
            z = ts[self.prefill]
            if not isinstance(z, torch.Tensor) or z.data_ptr() != out.data_ptr() or z.stride() != out.stride():
                return None
        bound = [(slot, t) for slot, t in zip(self.inputs, ts) if slot is not None] + [(self.output, out)]
        if not all(isinstance(t, torch.Tensor) and slot.fits(t) for slot, t in bound):
            return None
        home = (tuple(ts), out)
        if self._home is not None:
            return Direct(DirectCall(self)) if self._is_home(*home) else None
        self._home = home
        self._go_home()
        return Direct(DirectCall(self))

    def _is_home(self, ts: tuple, out) -> bool:
        hts, hout = self._home
        return out is hout and len(ts) == len(hts) and all(a is b for a, b in zip(ts, hts))

    def _go_home(self) -> None:
        ts, out = self._home
        self._bind(ts, out)
        self._cur[:] = list(ts) + [out]
        self._prefill_copy = False

    def _thread(self) -> None:
        self._tid = _get_ident()
        self._stream, self._scratch = self._resources.for_thread(self.prim.scratchpad_bytes)
        if self._scratch is not None:
            self._args[self._n - 1] = ExecArg(capi.ARG_SCRATCHPAD, self._scratch.handle)

    def _bind(self, ts: tuple, out: torch.Tensor):
        """Point every slot at this call's tensors; returns (the tensor to copy the result into
        afterwards, or None; the tensor the primitive writes)."""
        cur = self._cur
        for i, (slot, t) in enumerate(zip(self.inputs, ts)):
            if slot is None:
                cur[i] = t
                continue
            if not slot.fits(t):
                if not _convertible(t, slot):
                    raise TypeError(f"oneDNN {self.prim.what}: input {i} is {t.dtype} {tuple(t.shape)}, "
                                    f"expected {slot.dtype} {slot.shape}")
                fixed = slot.stage(t)
                self.converted += 1
                slot.memory.point(fixed.data_ptr())
                cur[i] = None                     # check again next call
                continue
            slot.memory.point(t.data_ptr())
            cur[i] = t
        copy_to = None
        if self.output.fits(out):
            self.output.memory.point(out.data_ptr())
            cur[-1] = out
        else:
            if not _convertible(out, self.output):
                raise TypeError(f"oneDNN {self.prim.what}: output is {out.dtype} {tuple(out.shape)}, "
                                f"expected {self.output.dtype} {self.output.shape}")
            copy_to, out = out, self.output.staging()
            self.converted += 1
            self.output.memory.point(out.data_ptr())
            cur[-1] = None
        return copy_to, out

    def __call__(self, *ts, out=None):
        fresh = out is None
        if fresh:
            out = self.output.empty()
        cur = self._cur
        copy_to = None
        rebound = out is not cur[-1] or any(map(_is_not, ts, cur))
        if rebound:
            copy_to, target = self._bind(ts, out)
            if self.prefill is not None:
                z = ts[self.prefill]
                self._prefill_copy = target.data_ptr() != z.data_ptr() or target.stride() != z.stride()
        else:
            target = out
        if self._prefill_copy:
            target.copy_(ts[self.prefill])
        if self._tid != _get_ident():
            self._thread()
        status = self._exec(self._handle, self._stream, self._n, self._args)
        if status:
            raise capi.DnnlError(f"execute {self.prim.what}", status)
        if copy_to is not None:
            copy_to.copy_(target)
            target = copy_to
        if self.after is not None:
            self.after(target, ts)
        if rebound and self._home is not None:
            self._go_home()                       # another caller's tensors: the direct call's back
        elif fresh:                               # a probe's tensors: not kept alive until the next call
            cur[:] = [None] * len(cur)
        return target


class DirectCall:
    """A kernel's call over its home tensors, executed by generated code: the kernel's primitive
    and argument array, on the scratchpad of the thread ``on_thread`` was last called on."""
    __slots__ = ("execute", "handle", "n", "args", "_kernel")

    def __init__(self, kernel: DnnlKernel):
        self._kernel = kernel
        self.execute, self.handle, self.n, self.args = kernel._exec, kernel._handle, kernel._n, kernel._args

    def on_thread(self):
        """Use this thread's scratchpad from now on; returns this thread's stream."""
        self._kernel._thread()
        return self._kernel._stream

    def fail(self, status: int):
        raise capi.DnnlError(f"execute {self._kernel.prim.what}", status)
