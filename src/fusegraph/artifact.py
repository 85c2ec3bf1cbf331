"""The ``.fgm`` artifact: an optimised, planned model that loads and runs with no compile step.

One file, little-endian, nothing in it is ever unpickled::

    0    magic  b"\\x89FGM\\r\\n\\x1a\\n"                    8 bytes
    8    header length H                                   u64
    16   SHA-256 of the header                             32 bytes
    48   header: JSON (format version, fusegraph / torch / python versions, device kind, CPU
         architecture + capability + required CPU flags, byte order, config, parts)
    A = first multiple of 64 at or after 48 + H: the parts area, each part 64-aligned, in
         order, zero padding between:
         graph    JSON (``ir.serialize``), no tensor data
         report   JSON (``CompileReport`` and, once planning lands, the plan)
         weights  a plain safetensors blob; constants under their value names, the data
                  section 64-aligned and each tensor at its compiled address modulo 64 (SIMD
                  kernels round differently on differently aligned data), gaps filled by
                  padding entries listed in the metadata, as are permuted (transposed) layouts

``header.parts[name] = {offset (from A), length, sha256}``; the file ends exactly at the last
part. Weights are memory-mapped copy-on-write (kernels may scribble on their copy, never on the
file). ``load`` runs no pass and no planning: it only rebuilds the graph, checks it, and binds
kernels; ``LOAD_STATS`` shows the stage counters of ``compiler.STAGE_RUNS`` did not move.

Everything wrong with a file -- truncated, bit-flipped, spliced, checksum mismatch, a future
format version, a part that escapes the file, absurd sizes, malformed JSON, a graph that fails
``verify()``, a device or CPU instruction set this machine lacks -- is an ``ArtifactError``.
``unpack``/``pack`` read and re-seal the parts (for ``inspect`` and for tests).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import platform
import struct
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import compiler
from .artifact_machine import HINT, check_machine as _check_machine, cpu_requirements, machine
from .compiler import CompiledModel
from .config_file import config_from_mapping
from .errors import ArtifactError, FusegraphError, VerifyError
from .ir.serialize import graph_from_dict, graph_to_dict
from .report.compile_report import CompileReport, FusionRecord, PassStat

MAGIC = b"\x89FGM\r\n\x1a\n"
FORMAT_VERSION = 1
PARTS = ("graph", "report", "weights")
_PREFIX = struct.Struct("<8sQ32s")
_ALIGN = 64
_MAX_HEADER = 1 << 24
_MAX_JSON_PART = 1 << 30
_MAX_FILE = 1 << 40
_MAX_THREADS = 4096
LOAD_STATS = {"loads": 0, "passes_run": 0, "plans_run": 0}

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
              "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
              "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
              "C64": torch.complex64}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
# torch CPU capability -> the /proc/cpuinfo flags its kernels need (x86); rank orders them.
def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


# ----- container ------------------------------------------------------------------------------
def pack(path: str | Path, header: dict, parts: dict[str, Any]) -> None:
    """Seal ``parts`` (name -> bytes or list of buffers) under ``header`` into ``path``, atomically."""
    header = dict(header)
    chunks = {k: v if isinstance(v, list) else [v] for k, v in parts.items()}
    table, offset = {}, 0
    for name in PARTS:
        h = hashlib.sha256()
        length = 0
        for c in chunks[name]:
            h.update(c)
            length += memoryview(c).nbytes
        table[name] = {"offset": offset, "length": length, "sha256": h.hexdigest()}
        offset = _align(offset + length)
    header["parts"] = table
    header["parts_size"] = table[PARTS[-1]]["offset"] + table[PARTS[-1]]["length"]
    blob = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(blob), hashlib.sha256(blob).digest()))
            f.write(blob)
            base = _align(_PREFIX.size + len(blob))
            for name in PARTS:
                f.write(b"\0" * (base + table[name]["offset"] - f.tell()))
                for c in chunks[name]:
                    f.write(c)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _want(cond: bool, msg: str) -> None:
    if not cond:
        raise ArtifactError(msg)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _read_header(f, size: int, where: str) -> tuple[dict, int]:
    _want(size >= _PREFIX.size, f"{where}: truncated: {size} bytes is shorter than the artifact prefix")
    magic, hlen, digest = _PREFIX.unpack(f.read(_PREFIX.size))
    _want(magic == MAGIC, f"{where}: not a fusegraph artifact (bad magic {magic[:8]!r})")
    _want(hlen <= _MAX_HEADER, f"{where}: absurd header length {hlen}")
    _want(_PREFIX.size + hlen <= size, f"{where}: truncated: the header needs {hlen} bytes, the file "
                                       f"has {size - _PREFIX.size}")
    blob = f.read(hlen)
    _want(hashlib.sha256(blob).digest() == digest, f"{where}: header checksum mismatch (corrupt or "
                                                   f"tampered file)")
    header = _json(blob, where, "header")
    _want(isinstance(header, dict), f"{where}: header is not a JSON object")
    version = header.get("format_version")
    _want(_is_int(version) and version >= 1, f"{where}: invalid format version {version!r}")
    _want(version <= FORMAT_VERSION, f"{where}: format version {version} is newer than this fusegraph "
                                     f"reads ({FORMAT_VERSION}); upgrade fusegraph or {HINT}")
    for key, typ in (("device", dict), ("cpu", dict), ("config", dict), ("parts", dict)):
        _want(isinstance(header.get(key), typ), f"{where}: header field {key!r} missing or malformed")
    _want(header.get("byteorder") == sys.byteorder, f"{where}: built on a {header.get('byteorder')}-endian "
                                                    f"machine, this one is {sys.byteorder}-endian; {HINT}")
    return header, _align(_PREFIX.size + hlen)


def _check_layout(header: dict, base: int, size: int, where: str) -> dict:
    parts = header["parts"]
    for name in parts:
        _want(name in PARTS, f"{where}: part {str(name)[:80]!r} is not one of {PARTS}: refused (a member "
                             f"name outside the format escapes it)")
    expect = 0
    for name in PARTS:
        p = parts.get(name)
        _want(isinstance(p, dict) and _is_int(p.get("offset")) and _is_int(p.get("length"))
              and isinstance(p.get("sha256"), str), f"{where}: part {name!r} missing or malformed")
        off, length = p["offset"], p["length"]
        _want(0 <= length <= _MAX_FILE, f"{where}: part {name!r} declares absurd length {length}")
        _want(off == expect, f"{where}: part {name!r} at offset {off} escapes the layout (expected {expect})")
        _want(base + off + length <= size, f"{where}: truncated: part {name!r} ends at byte "
                                           f"{base + off + length}, the file has {size}")
        expect = _align(off + length)
    end = base + parts[PARTS[-1]]["offset"] + parts[PARTS[-1]]["length"]
    _want(header.get("parts_size") == end - base and size == end,
          f"{where}: file is {size} bytes but its parts end at {end} (truncated or appended to)")
    return parts


def _json(blob, where: str, what: str) -> Any:
    try:
        return json.loads(bytes(blob))
    except (ValueError, RecursionError) as exc:
        raise ArtifactError(f"{where}: {what} is not valid JSON: {str(exc)[:200]}") from None


def unpack(path: str | Path) -> tuple[dict, dict[str, bytes]]:
    """The checked header and every part's bytes (copies; for tools and tests)."""
    header, mm, parts = _open(Path(path))
    try:
        base = _align(_PREFIX.size + _header_len(mm))
        return header, {k: bytes(mm[base + p["offset"]: base + p["offset"] + p["length"]])
                        for k, p in parts.items()}
    finally:
        del mm


def _open(path: Path, check_machine: bool = False):
    where = str(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ArtifactError(f"cannot open artifact {where!r}: {exc.strerror or exc}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        _want(size <= _MAX_FILE, f"{where}: absurd file size {size}")
        header, base = _read_header(f, size, where)
        parts = _check_layout(header, base, size, where)
        if check_machine:
            _check_machine(header, machine(), where)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        _want(len(mm) == size, f"{where}: the file changed while it was being read")
    view = memoryview(mm)
    try:
        pos = _PREFIX.size + _header_len(mm)
        for name in PARTS:
            off, length = base + parts[name]["offset"], parts[name]["length"]
            _want(not any(view[pos:off]), f"{where}: nonzero padding before part {name!r} (corrupt file)")
            _want(hashlib.sha256(view[off:off + length]).hexdigest() == parts[name]["sha256"],
                  f"{where}: checksum mismatch in part {name!r} (corrupt or tampered file)")
            pos = off + length
    finally:
        view.release()
    return header, mm, parts


def _header_len(mm) -> int:
    return _PREFIX.unpack_from(mm, 0)[1]


# ----- weights (safetensors) -------------------------------------------------------------------
def _weights_part(tensors: dict[str, torch.Tensor]) -> list:
    """A safetensors blob as buffers. The data section starts 64-aligned in the file and each
    tensor sits at the address the compiled model's tensor had modulo 64 (SIMD kernels can round
    differently on differently aligned data), gaps being filled by padding entries."""
    entries, perms, pads, bufs, offset, broadcast = {}, {}, [], [], 0, {}
    for key in sorted(tensors):
        src = tensors[key].detach()
        t = src.cpu()
        if t.dtype not in _ST_NAMES:
            raise ArtifactError(f"cannot save tensor {key!r}: dtype {t.dtype} has no safetensors form")
        if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):  # a folded fill: its base only
            broadcast[key] = list(t.shape)
            t = t[tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())]
            t = torch.empty(t.shape, dtype=t.dtype).copy_(t)   # real strides, even on size-1 axes
        if not t.is_contiguous():  # keep a permuted layout as it is (same kernels, same bits)
            perm = sorted(range(t.dim()), key=lambda d: -t.stride(d))
            if t.permute(perm).is_contiguous():
                perms[key], t = perm, t.permute(perm)
            else:
                t = t.contiguous()
        want = src.data_ptr() % _ALIGN if src.data_ptr() % t.element_size() == 0 else 0
        gap = (want - offset) % _ALIGN
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
                               "fusegraph.padding": json.dumps(pads), "fusegraph.broadcast": json.dumps(broadcast)}
    head = json.dumps(entries, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % _ALIGN)
    return [struct.pack("<Q", len(head)) + head] + bufs


def _read_weights(mm, start: int, length: int, where: str, broadcast_limit: int) -> dict[str, torch.Tensor]:
    _want(length >= 8, f"{where}: weights part is truncated")
    n = struct.unpack_from("<Q", mm, start)[0]
    _want(n <= min(length - 8, _MAX_HEADER * 8), f"{where}: weights header declares absurd length {n}")
    head = _json(mm[start + 8:start + 8 + n], where, "weights header")
    _want(isinstance(head, dict), f"{where}: weights header is not a JSON object")
    meta = head.pop("__metadata__", {})
    _want(isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()),
          f"{where}: weights metadata is malformed")
    perms = _json(meta.get("fusegraph.perms", "{}").encode(), where, "weights metadata")
    pads = _json(meta.get("fusegraph.padding", "[]").encode(), where, "weights metadata")
    broadcast = _json(meta.get("fusegraph.broadcast", "{}").encode(), where, "weights metadata")
    _want(isinstance(perms, dict) and isinstance(pads, list) and all(isinstance(p, str) for p in pads)
          and isinstance(broadcast, dict), f"{where}: weights metadata is malformed")
    data0, data_len = start + 8 + n, length - 8 - n
    spans, out = [], {}
    for key, e in head.items():
        ok = (isinstance(e, dict) and e.get("dtype") in _ST_DTYPES and isinstance(e.get("shape"), list)
              and len(e["shape"]) <= 64 and all(_is_int(d) and d >= 0 for d in e["shape"])
              and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
              and all(_is_int(x) for x in e["data_offsets"]))
        _want(ok, f"{where}: weights entry {key[:80]!r} is malformed")
        dtype, shape, (b, end) = _ST_DTYPES[e["dtype"]], e["shape"], e["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        itemsize = dtype.itemsize
        _want(0 <= b <= end <= data_len and end - b == numel * itemsize,
              f"{where}: weights entry {key[:80]!r} declares {shape} {e['dtype']} but spans bytes "
              f"{b}..{end} of {data_len}")
        _want((data0 + b) % itemsize == 0, f"{where}: weights entry {key[:80]!r} is misaligned")
        spans.append((b, end))
        t = torch.frombuffer(mm, dtype=dtype, count=numel, offset=data0 + b).reshape(shape) if numel \
            else torch.empty(shape, dtype=dtype)
        if dtype == torch.bool and numel:
            _want(not bool(t.view(torch.uint8).gt(1).any()), f"{where}: bool tensor {key[:80]!r} holds "
                                                            f"bytes other than 0 and 1")
        perm = perms.get(key)
        if perm is not None:
            _want(isinstance(perm, list) and sorted(perm) == list(range(len(shape))),
                  f"{where}: weights entry {key[:80]!r} has a malformed permutation")
            t = t.permute([perm.index(i) for i in range(len(perm))])
        if key in broadcast:
            t = _broadcast(t, broadcast[key], broadcast_limit, f"{where}: weights entry {key[:80]!r}")
        out[key] = t
    spans.sort()
    for (_, e0), (b1, _) in zip(spans, spans[1:]):
        _want(b1 >= e0, f"{where}: weights entries overlap")
    for pad in pads:
        out.pop(pad, None)
    return out


def _broadcast(base: torch.Tensor, shape, limit: int, where: str) -> torch.Tensor:
    """``base`` (size 1 on the repeated axes) broadcast to ``shape``, the stored form of a folded
    fill; its logical size must be within the config's ``fold_broadcast_limit`` (it is
    materialised when the model is bound)."""
    _want(isinstance(shape, list) and len(shape) == base.dim() and all(_is_int(d) and d >= 0 for d in shape)
          and all(b in (1, d) for b, d in zip(base.shape, shape)),
          f"{where}: broadcast shape {str(shape)[:80]} does not extend {list(base.shape)}")
    numel = 1
    for d in shape:
        numel *= d
    _want(numel * base.element_size() <= limit, f"{where}: broadcast to {shape} is {numel} elements, over "
                                                f"the config's fold_broadcast_limit of {limit} bytes")
    return base.expand(shape)


# ----- save / load -----------------------------------------------------------------------------
def _jsonable(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item") and callable(o.item):
        try:
            return o.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def save(model: CompiledModel, path: str | Path) -> None:
    """Write ``model`` to ``path`` as a ``.fgm`` artifact."""
    try:
        model.graph.verify()
    except FusegraphError as exc:
        raise ArtifactError(f"cannot save {model.name}: the graph is broken: {exc}") from None
    data, tensors = graph_to_dict(model.graph)
    here = machine()
    weights_dev = "cuda" if any(t.is_cuda for t in tensors.values()) else "cpu"
    on_cuda = weights_dev == "cuda" or model.config.device == "cuda"
    plan = getattr(model, "plan", None)
    report = {"report": model.report.to_dict(), "plan": plan.to_dict() if hasattr(plan, "to_dict") else None}
    cap = here["capability"]
    header = {
        "format": "fusegraph-artifact", "format_version": FORMAT_VERSION, "byteorder": sys.byteorder,
        "fusegraph_version": _version(), "torch_version": torch.__version__,
        "python_version": platform.python_version(), "model": model.name,
        "device": {"kind": "cuda", "capability": here["cuda"], "weights": weights_dev} if on_cuda
        else {"kind": "cpu", "weights": "cpu"},
        "cpu": {"arch": here["arch"], "capability": cap,
                "requires": cpu_requirements(cap, here["flags"])},
        "config": model.config.to_dict(),
    }
    parts = {"graph": json.dumps(data, separators=(",", ":"), allow_nan=False).encode(),
             "report": json.dumps(report, separators=(",", ":"), default=_jsonable).encode(),
             "weights": _weights_part(tensors)}
    pack(path, header, parts)


def _version() -> str:
    from . import __version__
    return __version__


class _Record(dict):
    """A report section read back from JSON: dict with attribute access (``report.memory.arena_bytes``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict:
        return dict(self)


def _records(x: Any) -> Any:
    if isinstance(x, dict):
        return _Record({k: _records(v) for k, v in x.items()})
    return [_records(v) for v in x] if isinstance(x, list) else x


def _report(data: Any, where: str) -> CompileReport:
    _want(isinstance(data, dict) and isinstance(data.get("report"), dict), f"{where}: report is malformed")
    d = data["report"]
    try:
        report = CompileReport(**{k: v for k, v in d.items() if k in CompileReport.__dataclass_fields__
                                  and k not in ("passes", "fusions", "memory", "streams")})
        report.passes = [PassStat(**p) for p in d.get("passes", [])]
        report.fusions = [FusionRecord(**r) for r in d.get("fusions", [])]
    except TypeError as exc:
        raise ArtifactError(f"{where}: report is malformed: {exc}") from None
    report.memory, report.streams = _records(d.get("memory")), _records(d.get("streams"))
    report.timings = dict(report.timings) if isinstance(report.timings, dict) else {}
    return report


def load(path: str | Path) -> CompiledModel:
    """Load a ``.fgm`` artifact: no pass and no planning runs; weights are memory-mapped."""
    t0 = time.perf_counter()
    where = str(path)
    before = dict(compiler.STAGE_RUNS)
    try:
        header, mm, parts = _open(Path(path), check_machine=True)
        base = _align(_PREFIX.size + _header_len(mm))
        start, length = base + parts["weights"]["offset"], parts["weights"]["length"]
        config = config_from_mapping(header["config"], f"{where}: config")
        _want(config.threads is None or config.threads <= _MAX_THREADS, f"{where}: absurd thread count")
        tensors = _read_weights(mm, start, length, where, config.fold_broadcast_limit)
        blobs = {}
        for name in ("graph", "report"):
            off, length = base + parts[name]["offset"], parts[name]["length"]
            _want(length <= _MAX_JSON_PART, f"{where}: part {name!r} declares absurd length {length}")
            blobs[name] = _json(mm[off:off + length], where, f"part {name!r}")
        graph = graph_from_dict(blobs["graph"], tensors)
        try:
            graph.verify()
        except VerifyError as exc:
            raise ArtifactError(f"{where}: the stored graph fails verify() (corrupt or tampered "
                                f"file): {exc}") from None
        names = graph.meta.get("output_names")  # the runtime reads it: it must name each output once
        _want(names is None or (isinstance(names, list) and len(names) == len(graph.outputs) and
                                all(isinstance(n, str) for n in names) and len(set(names)) == len(names)),
              f"{where}: graph meta 'output_names' does not name each output once")
        report = _report(blobs["report"], where)
        if header["device"].get("weights") == "cuda":  # where the compiled model kept them
            for v in graph.constants.values():
                v.const = v.const.to("cuda")
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        model = CompiledModel.from_optimized(graph, config, report)
    except ArtifactError:
        raise
    except FusegraphError as exc:  # ConfigError, UnsupportedOpError ...
        raise ArtifactError(f"{where}: artifact refused: {type(exc).__name__}: {exc}; {HINT}") from exc
    except MemoryError:
        raise
    except Exception as exc:  # a hostile file must never escape as anything but ArtifactError
        raise ArtifactError(f"{where}: malformed artifact: {type(exc).__name__}: {exc}") from exc
    ran = {k: compiler.STAGE_RUNS[k] - before[k] for k in before}
    LOAD_STATS["loads"] += 1
    LOAD_STATS["passes_run"] += ran["passes"]
    LOAD_STATS["plans_run"] += ran["plan"]
    seconds = time.perf_counter() - t0
    report.timings["load"] = seconds
    model.load_info = {"path": where, "seconds": seconds, "passes_run": ran["passes"],
                       "plans_run": ran["plan"], "format_version": header["format_version"],
                       "built_with": {k: header.get(k) for k in ("fusegraph_version", "torch_version")}}
    return model
