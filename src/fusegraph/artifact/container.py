"""The ``.fgm`` container: prefix, JSON header, 64-aligned parts, and their checksums.

Layout (little-endian)::

    0    magic  b"\\x89FGM\\r\\n\\x1a\\n"                    8 bytes
    8    header length H                                   u64
    16   SHA-256 of the header                             32 bytes
    48   header: JSON object; ``header.parts[name] = {offset (from A), length, xxh3_128}``
    A = first multiple of 64 at or after 48 + H: the parts, each 64-aligned, in ``PARTS`` order,
        zero padding between; the file ends exactly at the last part.

A part's ``xxh3_128`` is a list: the XXH3-128 digest of each ``CHUNK``-byte piece of the part,
in order (one digest for an empty part). The digests detect corruption (truncation, bit flips,
splices): a digest stored in the same file cannot authenticate it whatever the hash, so the
part digests use a non-cryptographic hash, many times faster to check than SHA-256, which was
most of the load time of the large models (benchmarks/RESULTS.md, "Load time"); the header
keeps its SHA-256.
Chunks let a loader check a large weights part while it decodes the other parts (``Checksums``).
``pack`` seals parts atomically; ``open_artifact`` checks the prefix, header and layout and
reads the file into private memory (advised for huge pages once read: ``advise_huge_pages``);
``Checksums`` verifies padding and digests. Every fault is an
``ArtifactError``. Nothing here knows what the parts hold.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import sys
import threading
from pathlib import Path
from typing import Any, Iterable

import xxhash

from ..errors import ArtifactError

MAGIC = b"\x89FGM\r\n\x1a\n"
FORMAT_VERSION = 3            # 3: weights the CPU backend holds packed are stored packed only (oneDNN layouts)
PARTS = ("graph", "report", "weights")
CHUNK = 4 << 20
DIGEST = "xxh3_128"           # the key of a part's chunk digests in the header
RECOMPILE = "recompile the model on this machine (fusegraph compile MODEL -o OUT.fgm)"
PREFIX = struct.Struct("<8sQ32s")
ALIGN = 64
_MAX_HEADER = 1 << 24
_MAX_FILE = 1 << 40
_THREADED_CHUNKS = 4


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def want(cond: bool, msg: str) -> None:
    if not cond:
        raise ArtifactError(msg)


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def json_value(blob, where: str, what: str) -> Any:
    try:
        return json.loads(bytes(blob))
    except (ValueError, RecursionError) as exc:
        raise ArtifactError(f"{where}: {what} is not valid JSON: {str(exc)[:200]}") from None


def _chunks(length: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + CHUNK, length)) for lo in range(0, length, CHUNK)] or [(0, 0)]


def pack(path: str | Path, header: dict, parts: dict[str, Any]) -> None:
    """Seal ``parts`` (name -> bytes or list of buffers) under ``header`` into ``path``, atomically."""
    header = dict(header)
    table, offset, sealed = {}, 0, {}
    for name in PARTS:
        bufs = [memoryview(c).cast("B") for c in (parts[name] if isinstance(parts[name], list) else [parts[name]])]
        digests, h, filled = [], xxhash.xxh3_128(), 0
        for buf in bufs:      # CHUNK-sized digests across buffer boundaries
            while len(buf):
                take = min(len(buf), CHUNK - filled)
                h.update(buf[:take])
                buf, filled = buf[take:], filled + take
                if filled == CHUNK:
                    digests.append(h.hexdigest())
                    h, filled = xxhash.xxh3_128(), 0
        length = sum(len(b) for b in bufs)
        if filled or not digests:
            digests.append(h.hexdigest())
        table[name] = {"offset": offset, "length": length, DIGEST: digests}
        offset = align(offset + length)
        sealed[name] = bufs
    header["parts"] = table
    header["parts_size"] = table[PARTS[-1]]["offset"] + table[PARTS[-1]]["length"]
    blob = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(PREFIX.pack(MAGIC, len(blob), hashlib.sha256(blob).digest()))
            f.write(blob)
            base = align(PREFIX.size + len(blob))
            for name in PARTS:
                f.write(b"\0" * (base + table[name]["offset"] - f.tell()))
                for c in sealed[name]:
                    f.write(c)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _read_header(f, size: int, where: str) -> tuple[dict, int]:
    want(size >= PREFIX.size, f"{where}: truncated: {size} bytes is shorter than the artifact prefix")
    magic, hlen, digest = PREFIX.unpack(f.read(PREFIX.size))
    want(magic == MAGIC, f"{where}: not a fusegraph artifact (bad magic {magic[:8]!r})")
    want(hlen <= _MAX_HEADER, f"{where}: absurd header length {hlen}")
    want(PREFIX.size + hlen <= size, f"{where}: truncated: the header needs {hlen} bytes, the file "
                                      f"has {size - PREFIX.size}")
    blob = f.read(hlen)
    want(hashlib.sha256(blob).digest() == digest, f"{where}: header checksum mismatch (corrupt or "
                                                  f"tampered file)")
    header = json_value(blob, where, "header")
    want(isinstance(header, dict), f"{where}: header is not a JSON object")
    version = header.get("format_version")
    want(is_int(version) and version >= 1, f"{where}: invalid format version {version!r}")
    want(version <= FORMAT_VERSION, f"{where}: format version {version} is newer than this fusegraph "
                                    f"reads ({FORMAT_VERSION}); upgrade fusegraph or {RECOMPILE}")
    want(version == FORMAT_VERSION, f"{where}: format version {version} is older than this fusegraph "
                                    f"reads ({FORMAT_VERSION}): {RECOMPILE}")
    for key, typ in (("device", dict), ("cpu", dict), ("config", dict), ("parts", dict)):
        want(isinstance(header.get(key), typ), f"{where}: header field {key!r} missing or malformed")
    want(header.get("byteorder") == sys.byteorder, f"{where}: built on a {header.get('byteorder')}-endian "
                                                   f"machine, this one is {sys.byteorder}-endian; {RECOMPILE}")
    return header, align(PREFIX.size + hlen)


def _check_layout(header: dict, base: int, size: int, where: str) -> dict:
    parts = header["parts"]
    for name in parts:
        want(name in PARTS, f"{where}: part {str(name)[:80]!r} is not one of {PARTS}: refused (a member "
                            f"name outside the format escapes it)")
    expect = 0
    for name in PARTS:
        p = parts.get(name)
        want(isinstance(p, dict) and is_int(p.get("offset")) and is_int(p.get("length"))
             and isinstance(p.get(DIGEST), list) and all(isinstance(d, str) for d in p[DIGEST]),
             f"{where}: part {name!r} missing or malformed")
        off, length = p["offset"], p["length"]
        want(0 <= length <= _MAX_FILE, f"{where}: part {name!r} declares absurd length {length}")
        want(len(p[DIGEST]) == len(_chunks(length)), f"{where}: part {name!r} lists "
             f"{len(p[DIGEST])} digests for {len(_chunks(length))} chunks")
        want(off == expect, f"{where}: part {name!r} at offset {off} escapes the layout (expected {expect})")
        want(base + off + length <= size, f"{where}: truncated: part {name!r} ends at byte "
                                          f"{base + off + length}, the file has {size}")
        expect = align(off + length)
    end = base + parts[PARTS[-1]]["offset"] + parts[PARTS[-1]]["length"]
    want(header.get("parts_size") == end - base and size == end,
         f"{where}: file is {size} bytes but its parts end at {end} (truncated or appended to)")
    return parts


class Artifact:
    """An opened file: checked header, part table, and the file's bytes in private memory."""

    def __init__(self, header: dict, parts: dict, mm: mmap.mmap, base: int, where: str):
        self.header, self.parts, self.mm, self.base, self.where = header, parts, mm, base, where

    def span(self, name: str) -> tuple[int, int]:
        """(start in the file, length) of part ``name``."""
        return self.base + self.parts[name]["offset"], self.parts[name]["length"]


def _read_private(f, size: int, where: str) -> mmap.mmap:
    """The whole file in private anonymous memory: what is loaded never depends on the file
    again (a file rewritten or truncated after ``load`` cannot change a run or raise SIGBUS)."""
    mm = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE)
    f.seek(0)
    with memoryview(mm) as view:
        got = 0
        while got < size:
            n = f.readinto(view[got:size])
            if not n:
                break
            got += n
    want(got == size and os.fstat(f.fileno()).st_size == size,
         f"{where}: the file changed while it was being read")
    advise_huge_pages(mm)
    return mm


def advise_huge_pages(mm: mmap.mmap) -> bool:
    """Mark the file's bytes in memory for 2 MiB pages (``MADV_HUGEPAGE``), after they are read:
    Linux's khugepaged then moves them into huge pages in the background, while the model
    runs, and a product that streams its weight every call (a decoder's steps) takes fewer
    TLB misses, as a compiled model's packed weights do from the start (``huge_pages.py``).
    Asked before the read, the faults themselves would allocate huge pages and the load would
    wait for them. False where the platform has no such advice (the bytes stay as they are)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not len(mm):
        return False
    try:
        mm.madvise(advice)
    except OSError:                 # a kernel without transparent huge pages
        return False
    return True


def open_artifact(path: Path) -> Artifact:
    """Check prefix, header and layout, and read the file into private memory (kernels may
    scribble on their copy of a weight, and a later change of the file affects nothing).
    Checksums are ``Checksums``' job."""
    where = str(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ArtifactError(f"cannot open artifact {where!r}: {exc.strerror or exc}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        want(size <= _MAX_FILE, f"{where}: absurd file size {size}")
        header, base = _read_header(f, size, where)
        parts = _check_layout(header, base, size, where)
        mm = _read_private(f, size, where)
    return Artifact(header, parts, mm, base, where)


class Checksums:
    """Verify an artifact's zero padding and part digests. ``start(later)`` checks every part
    not in ``later`` at once and hands the chunks of ``later`` to worker threads (one fewer
    than the CPUs, at least one; none for fewer than ``_THREADED_CHUNKS`` chunks, which
    ``finish`` hashes itself); ``finish()`` helps with what is left, joins, and raises the
    ``ArtifactError`` of the first part whose digest does not match."""

    def __init__(self, art: Artifact):
        self.art = art
        self._jobs: list[tuple[str, int, int, str]] = []
        self._next = 0
        self._lock = threading.Lock()
        self._bad: set[str] = set()
        self._threads: list[threading.Thread] = []

    def start(self, later: Iterable[str] = ()) -> "Checksums":
        art, later = self.art, set(later)
        pos = PREFIX.size + PREFIX.unpack_from(art.mm, 0)[1]
        for name in PARTS:
            start, length = art.span(name)
            want(not art.mm[pos:start].strip(b"\0"), f"{art.where}: nonzero padding before part {name!r} "
                                                      f"(corrupt file)")
            jobs = [(name, start + lo, start + hi, d) for (lo, hi), d in zip(_chunks(length), art.parts[name][DIGEST])]
            if name in later:
                self._jobs += jobs
            else:
                for job in jobs:
                    self._check(job)
                self.raise_bad()
            pos = start + length
        # a few chunks are hashed faster inline (in finish) than a thread starts and trades the GIL
        workers = 0 if len(self._jobs) < _THREADED_CHUNKS else max(1, (os.cpu_count() or 1) - 1)
        self._threads = [threading.Thread(target=self._work, daemon=True, name="fgm-checksum")
                         for _ in range(workers)]
        for t in self._threads:
            t.start()
        return self

    def _check(self, job: tuple[str, int, int, str]) -> None:
        name, lo, hi, digest = job
        with memoryview(self.art.mm) as view:
            ok = xxhash.xxh3_128(view[lo:hi]).hexdigest() == digest
        if not ok:
            self._bad.add(name)

    def _work(self) -> None:
        while True:
            with self._lock:
                i, self._next = self._next, self._next + 1
            if i >= len(self._jobs):
                return
            self._check(self._jobs[i])

    def raise_bad(self) -> None:
        for name in PARTS:
            want(name not in self._bad, f"{self.art.where}: checksum mismatch in part {name!r} (corrupt or "
                                        f"tampered file)")

    def finish(self) -> None:
        self._work()
        for t in self._threads:
            t.join()
        self.raise_bad()


def unpack(path: str | Path) -> tuple[dict, dict[str, bytes]]:
    """The checked header and every part's bytes (copies; for tools and tests)."""
    art = open_artifact(Path(path))
    Checksums(art).start().finish()
    out = {}
    for name in PARTS:
        start, length = art.span(name)
        out[name] = bytes(art.mm[start:start + length])
    return art.header, out
