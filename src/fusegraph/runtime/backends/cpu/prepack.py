"""oneDNN convolution weights in their blocked (prepacked) format, made once, or rebuilt from bytes.

``conv_weight(name, w, padding, stride, dilation, groups, input_size, provided)`` is what the
fused convolution kernel calls at bind time instead of ``torch.ops.mkldnn._reorder_convolution_weight``:
- when ``provided`` (the backend's imported state: a loaded artifact's forms) holds a packed
  form of weight ``name`` for the same geometry,
  made at the same intra-op thread count (oneDNN picks the blocked format by the thread
  count) by this torch build, that form is used as it is: no reorder runs;
- otherwise the weight is reordered, and the result is remembered (weakly, keyed by the
  weight tensor) so that ``packed_for(w)`` can hand it to ``artifact.save``.
A packed form travels as its bytes and oneDNN's serialized memory descriptor
(``torch.ops.mkldnn._get_mkldnn_serialized_md``); ``rebuild`` makes an mkldnn tensor over
those bytes without copying them, through torch's AOT-Inductor C shim
(``aoti_torch_create_tensor_from_blob_v2``), and checks its size against the bytes. When the
shim is missing, ``AVAILABLE`` is False and every weight is reordered. No pass logic here.
"""
from __future__ import annotations

import ctypes
import os
import struct
import weakref

import torch

_made: dict[int, tuple] = {}    # id(w) -> (weakref(w), [(key, weakref(packed), threads)])
reorders = [0]                  # weights reordered in this process (tests: a load reorders none)


def _shim():
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        make = lib.aoti_torch_create_tensor_from_blob_v2
        codes = [getattr(lib, n) for n in ("aoti_torch_dtype_float32", "aoti_torch_device_type_cpu",
                                            "aoti_torch_layout__mkldnn")]
        steal = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr
        ops = (torch.ops.mkldnn._get_mkldnn_serialized_md, torch.ops.mkldnn._nbytes, torch.ops.mkldnn.data_ptr)
    except (OSError, AttributeError, RuntimeError):
        return None
    for c in codes:
        c.restype = ctypes.c_int32
    make.restype = ctypes.c_int32
    make.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                     ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
                     ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64]
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype, capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return make, [c() for c in codes], steal, capsule, ops


_SHIM = _shim() if torch.backends.mkldnn.is_available() else None
AVAILABLE = _SHIM is not None


def conv_key(w: torch.Tensor, padding, stride, dilation, groups: int, input_size) -> list:
    return [list(w.shape), list(padding), list(stride), list(dilation), int(groups), list(input_size)]


def conv_weight(name: str, w: torch.Tensor, padding, stride, dilation, groups: int, input_size,
                provided: dict | None = None) -> torch.Tensor:
    key = conv_key(w, padding, stride, dilation, groups, input_size)
    threads = torch.get_num_threads()
    packed = None
    for k, make, t in (provided or {}).get(name, ()) if w.dtype == torch.float32 else ():
        if k == key and t == threads:
            packed = make()
            break
    if packed is None:
        reorders[0] += 1
        packed = torch.ops.mkldnn._reorder_convolution_weight(w.contiguous(), list(padding), list(stride),
                                                              list(dilation), groups, list(input_size))
    if w.dtype != torch.float32:     # the stored form's descriptor is checked as float32's:
        return packed                # reduced-precision weights are reordered at each bind
    entry = _made.get(id(w))
    if entry is None or entry[0]() is not w:
        entry = _made[id(w)] = (weakref.ref(w, lambda _, i=id(w): _made.pop(i, None)), [])
    entry[1].append((key, weakref.ref(packed), threads))
    return packed


def packed_for(w: torch.Tensor) -> list[tuple[list, torch.Tensor, int]]:
    """The packed forms made for weight ``w`` still alive: ``[(key, packed, threads)]``."""
    entry = _made.get(id(w))
    if entry is None or entry[0]() is not w:
        return []
    return [(k, p, t) for k, ref, t in entry[1] if (p := ref()) is not None]


def to_bytes(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the packed bytes as a uint8 tensor sharing their memory, the serialized descriptor)."""
    md, nbytes, data_ptr = _SHIM[4]
    n = int(nbytes(packed))
    buf = (ctypes.c_uint8 * n).from_address(int(data_ptr(packed)))
    data = torch.frombuffer(buf, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
    data._fgm_owner = packed       # the bytes live as long as the view of them
    return data, md(packed).clone()


_I32, _I64 = struct.Struct("<i"), struct.Struct("<12q")
# where the fields of a serialized oneDNN v3 memory descriptor lie (bytes): a leading int32,
# ndims, dims, data type, padded dims and offsets, offset0, format kind, then the blocking
# description (strides, number of inner blocks, inner block sizes and their dimensions)
_DIMS, _DTYPE, _PADDED, _POFFS, _OFF0, _KIND, _STRIDES, _NBLKS, _BLKS, _IDXS, _END = (
    8, 104, 112, 208, 304, 312, 320, 416, 424, 520, 616)
_reference: list = []


def _reference_md() -> bytes:
    """A descriptor this build makes (a tiny weight, packed once per process): the constants."""
    if not _reference:
        w = torch.zeros(16, 16, 1, 1)
        p = torch.ops.mkldnn._reorder_convolution_weight(w, [0, 0], [1, 1], [1, 1], 1, [1, 16, 4, 4])
        _reference.append(bytes(_SHIM[4][0](p).numpy().tobytes()))
    return _reference[0]


def _checked_md(md: bytes, shape: list[int], nbytes: int) -> bytes | None:
    """``md`` rebuilt field by field from checked values (a plain blocked float32 layout of a
    weight of ``shape``, every element inside ``nbytes``), or None. Only such a descriptor is
    handed to oneDNN: one from a hostile file could make it read anywhere."""
    ref = _reference_md()
    tail = len(ref) - 4   # ideep appends the group count to oneDNN's descriptor
    if len(md) != len(ref) or len(ref) < _END + 4 or md[:4] != ref[:4] or md[_END:tail] != ref[_END:tail]:
        return None
    ndims = _I32.unpack_from(md, 4)[0]
    if ndims not in (4, 5) or md[_DTYPE:_DTYPE + 4] != ref[_DTYPE:_DTYPE + 4] or md[_KIND:_KIND + 4] != ref[_KIND:_KIND + 4]:
        return None
    dims, padded, poffs, strides, blks, idxs = (list(_I64.unpack_from(md, o))
                                                 for o in (_DIMS, _PADDED, _POFFS, _STRIDES, _BLKS, _IDXS))
    nblks, off0 = _I32.unpack_from(md, _NBLKS)[0], struct.unpack_from("<q", md, _OFF0)[0]
    logical = list(shape) if ndims == len(shape) else [dims[0], dims[1]] + list(shape[1:])
    if ndims == 5 and (dims[0] < 1 or dims[0] * dims[1] != shape[0]):
        return None
    groups = dims[0] if ndims == 5 else 1
    if _I32.unpack_from(md, tail)[0] != groups:
        return None
    if dims[:ndims] != logical or any(dims[ndims:]) or any(poffs) or off0 or not 0 <= nblks <= 6:
        return None
    if any(padded[ndims:]) or any(strides[ndims:]) or any(blks[nblks:]) or any(idxs[nblks:]):
        return None
    per_dim = [1] * ndims
    for b, i in zip(blks[:nblks], idxs[:nblks]):
        if not (1 <= b <= 64 and 0 <= i < ndims):
            return None
        per_dim[i] *= b
    last, inner = 0, 1
    for b in blks[:nblks]:
        inner *= b
    for d, p, st, blk in zip(dims, padded, strides, per_dim):
        if not (d <= p <= d + 64 and p % blk == 0 and st >= 1):
            return None
        last += (p // blk - 1) * st
    if (last + inner) * 4 > nbytes:
        return None
    out = bytearray(len(ref))
    out[:4], out[_END:] = ref[:4], ref[_END:]
    _I32.pack_into(out, tail, groups)
    _I32.pack_into(out, 4, ndims)
    out[_DTYPE:_DTYPE + 4] = ref[_DTYPE:_DTYPE + 4]
    out[_KIND:_KIND + 4] = ref[_KIND:_KIND + 4]
    for off, vals in ((_DIMS, dims), (_PADDED, padded), (_STRIDES, strides), (_BLKS, blks), (_IDXS, idxs)):
        _I64.pack_into(out, off, *vals)
    _I32.pack_into(out, _NBLKS, nblks)
    return bytes(out)


def rebuild(data: torch.Tensor, md: torch.Tensor, shape: list[int]) -> torch.Tensor | None:
    """An mkldnn tensor of ``shape`` over ``data`` (not copied; kept alive by the result) laid
    out as ``md`` says, or None when the descriptor does not describe exactly those bytes."""
    make, (f32, cpu, mkldnn), steal, capsule, (_, nbytes, _) = _SHIM
    n = len(shape)
    strides = [1] * n
    for i in range(n - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    if data.dtype != torch.uint8 or md.dtype != torch.uint8 or data.data_ptr() % 64:
        return None
    blob = _checked_md(md.contiguous().numpy().tobytes(), list(shape), data.numel())
    if blob is None:
        return None
    md = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    handle = ctypes.c_void_p()
    rc = make(data.data_ptr(), n, (ctypes.c_int64 * n)(*shape), (ctypes.c_int64 * n)(*strides), 0, f32, cpu, 0,
              ctypes.byref(handle), mkldnn, md.data_ptr(), md.numel())
    if rc != 0 or not handle.value:
        return None
    t = steal(capsule(handle.value, None, None))
    if list(t.shape) != list(shape) or int(nbytes(t)) != data.numel():
        return None
    t._fgm_owner = data
    return t
