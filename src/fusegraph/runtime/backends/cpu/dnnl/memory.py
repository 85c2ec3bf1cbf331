"""oneDNN memory descriptors and memory objects, made from torch tensor geometry.

- ``MemDesc``: an owned ``dnnl_memory_desc_t`` (destroyed with the object): ``MemDesc.of(shape,
  dtype, strides)`` for a plain (strided) torch tensor, ``MemDesc.tagged(dims, dt, tag)`` for a
  format tag (``TAG_ANY`` lets a primitive choose: blocked weights), ``MemDesc.clone(handle)``
  for one a primitive descriptor owns; ``describe()`` is its geometry as plain data
  (dims, data type, padded dims, strides, inner blocks): what an artifact records to check that
  stored bytes still fit the layout a primitive wants.
- ``Memory``: a ``dnnl_memory_t`` over a pointer this process owns (an arena slot, a tensor,
  a weight buffer); ``point(ptr)`` moves it.
- ``DTYPES``: torch dtype -> oneDNN data type.
Nothing here owns tensor memory: callers keep the tensors whose pointers they give alive.
"""
from __future__ import annotations

import ctypes as C

import torch

from . import capi
from .capi import Dims, check, vp

DTYPES = {torch.float32: capi.F32, torch.bfloat16: capi.BF16, torch.float16: capi.F16,
          torch.int32: capi.S32, torch.int8: capi.S8, torch.uint8: capi.U8}
TORCH_OF = {v: k for k, v in DTYPES.items()}


def _lib():
    return capi.load()


class MemDesc:
    __slots__ = ("handle", "_lib")

    def __init__(self, handle: vp):
        self.handle, self._lib = handle, _lib()

    @classmethod
    def of(cls, shape, dtype: torch.dtype, strides=None) -> "MemDesc":
        """A plain descriptor: ``shape`` with ``strides`` (contiguous ones by default)."""
        shape = tuple(int(d) for d in shape) or (1,)
        if strides is None:
            strides, acc = [], 1
            for d in reversed(shape):
                strides.insert(0, acc)
                acc *= d
        strides = tuple(int(s) for s in strides) or (1,)
        h = vp()
        check(_lib().memory_desc_create_with_strides(C.byref(h), len(shape), Dims(*shape), DTYPES[dtype],
                                                     Dims(*strides)), "memory_desc_create_with_strides")
        return cls(h)

    @classmethod
    def tagged(cls, dims, dt: int, tag: int) -> "MemDesc":
        h = vp()
        check(_lib().memory_desc_create_with_tag(C.byref(h), len(dims), Dims(*dims), dt, tag),
              "memory_desc_create_with_tag")
        return cls(h)

    @classmethod
    def clone(cls, handle) -> "MemDesc":
        """An owned copy of a descriptor someone else owns (a primitive descriptor's query)."""
        h = vp()
        check(_lib().memory_desc_clone(C.byref(h), handle), "memory_desc_clone")
        return cls(h)

    @property
    def size(self) -> int:
        return int(self._lib.memory_desc_get_size(self.handle))

    def __eq__(self, other) -> bool:
        return isinstance(other, MemDesc) and bool(self._lib.memory_desc_equal(self.handle, other.handle))

    __hash__ = None

    def _query_int(self, what: int) -> int:
        out = C.c_int32()
        check(self._lib.memory_desc_query(self.handle, what, C.byref(out)), "memory_desc_query")
        return out.value

    def _query_dims(self, what: int, n: int) -> list[int]:
        ptr = C.POINTER(C.c_int64)()
        check(self._lib.memory_desc_query(self.handle, what, C.byref(ptr)), "memory_desc_query")
        return [int(ptr[i]) for i in range(n)]

    def describe(self) -> dict:
        """The descriptor as plain data: two descriptors with equal descriptions lay out the
        same bytes the same way."""
        nd = self._query_int(capi.Q_NDIMS)
        out = {"dims": self._query_dims(capi.Q_DIMS, nd), "dt": self._query_int(capi.Q_DATA_TYPE),
               "padded": self._query_dims(capi.Q_PADDED_DIMS, nd), "kind": self._query_int(capi.Q_FORMAT_KIND),
               "size": self.size}
        if out["kind"] == capi.FORMAT_KIND_BLOCKED:
            nb = self._query_int(capi.Q_INNER_NBLKS)
            out["strides"] = self._query_dims(capi.Q_STRIDES, nd)
            out["blocks"] = self._query_dims(capi.Q_INNER_BLKS, nb) if nb else []
            out["idxs"] = self._query_dims(capi.Q_INNER_IDXS, nb) if nb else []
        return out

    def __del__(self):
        try:
            self._lib.memory_desc_destroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Memory:
    __slots__ = ("handle", "md", "ptr", "_lib")

    def __init__(self, md: MemDesc, ptr: int):
        self.md, self.ptr, self._lib = md, int(ptr), _lib()
        self.handle = vp()
        check(self._lib.memory_create(C.byref(self.handle), md.handle, self._lib.engine, vp(self.ptr)),
              "memory_create")

    def point(self, ptr: int) -> None:
        if ptr != self.ptr:
            check(self._lib.memory_set_data_handle(self.handle, vp(ptr)), "memory_set_data_handle")
            self.ptr = ptr

    def __del__(self):
        try:
            self._lib.memory_destroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
