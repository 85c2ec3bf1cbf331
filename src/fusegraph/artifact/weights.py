"""The weights part of a ``.fgm`` artifact: a plain safetensors blob, read back in place.

``weights_part(tensors)`` writes every constant under its value name. The data section starts
64-aligned in the file and each tensor sits at its compiled address modulo 64 (SIMD kernels
can round differently on differently aligned data), gaps being padding entries named in the
metadata, as are permuted (transposed) layouts and folded one-value fills (stored as their
base plus the broadcast shape). Weights the backend holds packed (its ``export_state()``:
``runtime/backends/cpu/backend.py``) travel in those forms: the bytes and a layout description
as uint8 entries named ``__fusegraph_packed__...``, listed in the metadata with their key;
a weight whose graph copy the backend released (a "meta" tensor: shape and dtype only) is
stored in its packed forms alone (``fusegraph.packed_only``: its dtype, shape and strides),
so the file, and the memory a load reads it into, hold each weight once. ``read_weights``
returns the packed forms as they are, for the backend's ``import_state``, and a meta
placeholder for each packed-only weight. ``read_weights`` checks every entry
(dtype, shape, span, alignment, overlap, bool bytes, permutations, broadcast limits) and
returns tensors that alias the loaded bytes: nothing is copied and nothing is unpickled.
Faults are ``ArtifactError``.
"""
from __future__ import annotations

import json
import struct

import torch

from .container import is_int, json_value, want
from ..errors import ArtifactError
from ..ir import is_broadcast

_ALIGN = 64
_MAX_HEADER = 1 << 24
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
              "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
              "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
              "C64": torch.complex64}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


PACKED = "__fusegraph_packed__"


def weights_part(tensors: dict[str, torch.Tensor], packed: dict[str, list] | None = None) -> list:
    """A safetensors blob as buffers. The data section starts 64-aligned in the file and each
    tensor sits at the address the compiled model's tensor had modulo 64 (SIMD kernels can round
    differently on differently aligned data), gaps being filled by padding entries."""
    entries, perms, pads, bufs, offset, broadcast = {}, {}, [], [], 0, {}
    tensors, forms = dict(tensors), {}
    for wname, lst in (packed or {}).items():     # oneDNN blocked forms: bytes + descriptor, as U8
        for i, (key, data, md, threads) in enumerate(lst):
            dname, mname = f"{PACKED}{i}:{wname}", f"{PACKED}{i}:md:{wname}"
            if dname in tensors or mname in tensors:
                continue
            tensors[dname], tensors[mname] = data, md
            forms.setdefault(wname, []).append({"key": key, "threads": threads, "data": dname, "md": mname})
    packed_only = {}
    for key in [k for k, t in tensors.items() if t.device.type == "meta"]:
        t = tensors.pop(key)
        if key not in forms:
            raise ArtifactError(f"cannot save weight {key!r}: the backend released it and stored no packed form")
        packed_only[key] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "strides": list(t.stride())}
    for key in sorted(tensors):
        src = tensors[key].detach()
        t = src.cpu()
        if t.dtype not in _ST_NAMES:
            raise ArtifactError(f"cannot save tensor {key!r}: dtype {t.dtype} has no safetensors form")
        if is_broadcast(t):  # a folded fill: its base only
            broadcast[key] = list(t.shape)
            t = t[tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())]
            t = torch.empty(t.shape, dtype=t.dtype).copy_(t)   # real strides, even on size-1 axes
        if not t.is_contiguous():  # keep a permuted layout as it is (same kernels, same bits)
            perm = sorted(range(t.dim()), key=lambda d: -t.stride(d))
            if t.permute(perm).is_contiguous():
                perms[key], t = perm, t.permute(perm)
            else:
                t = t.contiguous()
        aim = src.data_ptr() % _ALIGN if src.data_ptr() % t.element_size() == 0 and not key.startswith(PACKED) else 0
        gap = (aim - offset) % _ALIGN
        if gap:
            pad = f"__fusegraph_pad{len(pads)}__"
            while pad in tensors:
                pad += "_"
            pads.append(pad)
            entries[pad] = {"dtype": "U8", "shape": [gap], "data_offsets": [offset, offset + gap]}
            bufs.append(bytes(gap))
            offset += gap
        nbytes = t.numel() * t.element_size()
        entries[key] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        if nbytes:
            bufs.append(t.reshape(-1).view(torch.uint8).numpy())
        offset += nbytes
    entries["__metadata__"] = {"format": "pt", "fusegraph.perms": json.dumps(perms),
                               "fusegraph.padding": json.dumps(pads), "fusegraph.broadcast": json.dumps(broadcast),
                               "fusegraph.prepacked": json.dumps(forms), "fusegraph.packed_only": json.dumps(packed_only)}
    head = json.dumps(entries, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % _ALIGN)
    return [struct.pack("<Q", len(head)) + head] + bufs


def read_weights(mm, start: int, length: int, where: str, broadcast_limit: int) -> tuple[dict, dict]:
    """``({value name: tensor}, {weight name: [(key, data, md, threads)]})``: the constants (a
    meta placeholder for a packed-only weight), and the packed forms stored for weights (uint8
    tensors over the file)."""
    want(length >= 8, f"{where}: weights part is truncated")
    n = struct.unpack_from("<Q", mm, start)[0]
    want(n <= min(length - 8, _MAX_HEADER * 8), f"{where}: weights header declares absurd length {n}")
    head = json_value(mm[start + 8:start + 8 + n], where, "weights header")
    want(isinstance(head, dict), f"{where}: weights header is not a JSON object")
    meta = head.pop("__metadata__", {})
    want(isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()),
          f"{where}: weights metadata is malformed")
    perms = json_value(meta.get("fusegraph.perms", "{}").encode(), where, "weights metadata")
    pads = json_value(meta.get("fusegraph.padding", "[]").encode(), where, "weights metadata")
    broadcast = json_value(meta.get("fusegraph.broadcast", "{}").encode(), where, "weights metadata")
    want(isinstance(perms, dict) and isinstance(pads, list) and all(isinstance(p, str) for p in pads)
          and isinstance(broadcast, dict), f"{where}: weights metadata is malformed")
    data0, data_len = start + 8 + n, length - 8 - n
    spans, out = [], {}
    for key, e in head.items():
        ok = (isinstance(e, dict) and e.get("dtype") in _ST_DTYPES and isinstance(e.get("shape"), list)
              and len(e["shape"]) <= 64 and all(is_int(d) and d >= 0 for d in e["shape"])
              and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
              and all(is_int(x) for x in e["data_offsets"]))
        want(ok, f"{where}: weights entry {key[:80]!r} is malformed")
        dtype, shape, (b, end) = _ST_DTYPES[e["dtype"]], e["shape"], e["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        itemsize = dtype.itemsize
        want(0 <= b <= end <= data_len and end - b == numel * itemsize,
              f"{where}: weights entry {key[:80]!r} declares {shape} {e['dtype']} but spans bytes "
              f"{b}..{end} of {data_len}")
        want((data0 + b) % itemsize == 0, f"{where}: weights entry {key[:80]!r} is misaligned")
        spans.append((b, end))
        t = torch.frombuffer(mm, dtype=dtype, count=numel, offset=data0 + b).reshape(shape) if numel \
            else torch.empty(shape, dtype=dtype)
        if dtype == torch.bool and numel:
            want(not bool(t.view(torch.uint8).gt(1).any()), f"{where}: bool tensor {key[:80]!r} holds "
                                                            f"bytes other than 0 and 1")
        perm = perms.get(key)
        if perm is not None:
            want(isinstance(perm, list) and sorted(perm) == list(range(len(shape))),
                  f"{where}: weights entry {key[:80]!r} has a malformed permutation")
            t = t.permute([perm.index(i) for i in range(len(perm))])
        if key in broadcast:
            t = _broadcast(t, broadcast[key], broadcast_limit, f"{where}: weights entry {key[:80]!r}")
        out[key] = t
    spans.sort()
    for (_, e0), (b1, _) in zip(spans, spans[1:]):
        want(b1 >= e0, f"{where}: weights entries overlap")
    for pad in pads:
        out.pop(pad, None)
    forms = json_value(meta.get("fusegraph.prepacked", "{}").encode(), where, "weights metadata")
    want(isinstance(forms, dict), f"{where}: weights metadata is malformed")
    packed = {}
    for wname, lst in forms.items():
        want(isinstance(lst, list), f"{where}: prepacked forms of {wname[:80]!r} are malformed")
        for f in lst:
            want(isinstance(f, dict) and isinstance(f.get("key"), list) and is_int(f.get("threads"))
                 and all(isinstance(f.get(k), str) and f[k].startswith(PACKED) and f[k] in out
                         and out[f[k]].dtype == torch.uint8 and out[f[k]].dim() == 1 for k in ("data", "md")),
                 f"{where}: a prepacked form of {wname[:80]!r} is malformed")
            packed.setdefault(wname, []).append((f["key"], out[f["data"]], out[f["md"]], f["threads"]))
    for key in [k for k in out if k.startswith(PACKED)]:
        del out[key]
    only = json_value(meta.get("fusegraph.packed_only", "{}").encode(), where, "weights metadata")
    want(isinstance(only, dict), f"{where}: weights metadata is malformed")
    for wname, e in only.items():
        ok = (isinstance(e, dict) and e.get("dtype") in _ST_DTYPES and wname in packed and wname not in out
              and isinstance(e.get("shape"), list) and isinstance(e.get("strides"), list)
              and len(e["shape"]) == len(e["strides"]) <= 64
              and all(is_int(d) and 0 <= d < 1 << 40 for d in e["shape"] + e["strides"]))
        want(ok, f"{where}: packed-only weight {wname[:80]!r} is malformed")
        out[wname] = torch.empty_strided(e["shape"], e["strides"], dtype=_ST_DTYPES[e["dtype"]], device="meta")
    return out, packed


def _broadcast(base: torch.Tensor, shape, limit: int, where: str) -> torch.Tensor:
    """``base`` (size 1 on the repeated axes) broadcast to ``shape``, the stored form of a folded
    fill; its logical size must be within the config's ``fold_broadcast_limit`` (it is
    materialised when the model is bound)."""
    want(isinstance(shape, list) and len(shape) == base.dim() and all(is_int(d) and d >= 0 for d in shape)
          and all(b in (1, d) for b, d in zip(base.shape, shape)),
          f"{where}: broadcast shape {str(shape)[:80]} does not extend {list(base.shape)}")
    numel = 1
    for d in shape:
        numel *= d
    want(numel * base.element_size() <= limit, f"{where}: broadcast to {shape} is {numel} elements, over "
                                                f"the config's fold_broadcast_limit of {limit} bytes")
    return base.expand(shape)
