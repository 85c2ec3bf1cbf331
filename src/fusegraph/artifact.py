"""The ``.fgm`` artifact: an optimised, planned model that loads and runs with no compile step.

One file, nothing in it is ever unpickled (container: ``artifact_container.py``)::

    prefix   magic, header length, SHA-256 of the header
    header   JSON: format version, fusegraph / torch / python versions, device kind, CPU
             architecture + capability + required CPU flags (``artifact_machine.py``), byte
             order, config, and the part table (offset, length, SHA-256 per 4 MiB chunk)
    graph    JSON (``ir.serialize``), no tensor data
    report   JSON: the ``CompileReport``, the ``ExecutionPlan`` and the arena view strides
             the compile's layout probe found (``artifact_plan.py``)
    weights  a plain safetensors blob, folded and fused constants, and each oneDNN
             convolution weight also in its packed (blocked) form (``artifact_weights.py``)

The whole file is read into private memory on load and the file is closed: a file
rewritten, truncated or replaced after ``load`` changes nothing the model computes and cannot
raise SIGBUS (the cost, measured in benchmarks/RESULTS.md: the weights count as private
memory, RssAnon, instead of file-backed pages). ``load`` runs no pass, no planning and no probe: it checks the file, rebuilds the
graph and verifies it, restores and checks the stored plan, and binds kernels: a convolution
takes its stored packed weight, rebuilt over the loaded bytes, when the file comes from the
same torch build, CPU capability and thread count (else it packs the plain weight), so
nothing is left for the first run to do but what a compiled model's first run does. The
weights' digests are computed on worker threads while the JSON parts are decoded; they are
all checked before any kernel is bound. ``LOAD_STATS`` shows the stage counters of
``compiler.STAGE_RUNS`` did not move.

Everything wrong with a file -- truncated, bit-flipped, spliced, checksum mismatch, a future
or older format version, a part that escapes the file, absurd sizes, malformed JSON, a graph
that fails ``verify()``, a plan that does not fit the graph, a device or CPU instruction set
this machine lacks -- is an ``ArtifactError``. ``unpack``/``pack`` read and re-seal the parts
(for ``inspect`` and for tests).
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import compiler
from .artifact_container import (_ALIGN, _PREFIX, FORMAT_VERSION, MAGIC, PARTS, Checksums, align as _align,
                                 json_value, open_artifact, pack, unpack, want as _want)
from .artifact_machine import HINT, check_machine as _check_machine, cpu_requirements, machine
from .artifact_plan import plan_record, restore_plan
from .artifact_weights import packed_forms, provided_forms, read_weights, weights_part
from .compiler import CompiledModel
from .config_file import config_from_mapping
from .errors import ArtifactError, FusegraphError, VerifyError
from .ir.serialize import graph_from_dict, graph_to_dict
from .ops import prepack
from .report.compile_report import CompileReport, FusionRecord, PassStat

__all__ = ["FORMAT_VERSION", "MAGIC", "PARTS", "LOAD_STATS", "save", "load", "pack", "unpack", "machine",
           "_ALIGN", "_PREFIX"]
_MAX_JSON_PART = 1 << 30
_MAX_THREADS = 4096
LOAD_STATS = {"loads": 0, "passes_run": 0, "plans_run": 0}


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
    report = {"report": model.report.to_dict(), **(plan_record(model) or {"plan": None})}
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
             "weights": weights_part(tensors, packed_forms(model.graph))}
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


def _corrupt_first(checks: Checksums | None, exc: Exception) -> None:
    """A fault found while the weights were still being hashed: when their digests do not
    match, that is the cause to report (a flipped byte, not whatever it made fail)."""
    if checks is not None:
        try:
            checks.finish()
        except ArtifactError as bad:
            raise bad from exc


def load(path: str | Path) -> CompiledModel:
    """Load a ``.fgm`` artifact: no pass and no planning runs; the file is read once, into
private memory, and not touched again."""
    t0 = time.perf_counter()
    where = str(path)
    before = dict(compiler.STAGE_RUNS)
    checks = None
    try:
        art = open_artifact(Path(path))
        header = art.header
        _check_machine(header, machine(), where)
        checks = Checksums(art).start(later=("weights",))   # the weights hash on worker threads
        config = config_from_mapping(header["config"], f"{where}: config")
        _want(config.threads is None or config.threads <= _MAX_THREADS, f"{where}: absurd thread count")
        tensors, packed = read_weights(art.mm, *art.span("weights"), where, config.fold_broadcast_limit)
        blobs = {}
        for name in ("graph", "report"):
            start, length = art.span(name)
            _want(length <= _MAX_JSON_PART, f"{where}: part {name!r} declares absurd length {length}")
            blobs[name] = json_value(art.mm[start:start + length], where, f"part {name!r}")
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
        plan, strides = restore_plan(blobs["report"], graph, where)
        checks, pending = None, checks
        pending.finish()                   # every digest matched: now bind kernels to the weights
        if header["device"].get("weights") == "cuda":  # where the compiled model kept them
            for v in graph.constants.values():
                v.const = v.const.to("cuda")
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        same_build = (header.get("torch_version") == torch.__version__   # oneDNN's blocked formats
                      and header["cpu"].get("capability") == machine()["capability"])
        with prepack.provide(provided_forms(packed, where) if same_build else {}):
            model = CompiledModel.from_optimized(graph, config, report, plan, strides)
    except ArtifactError as exc:
        _corrupt_first(checks, exc)
        raise
    except FusegraphError as exc:  # ConfigError, UnsupportedOpError ...
        _corrupt_first(checks, exc)
        raise ArtifactError(f"{where}: artifact refused: {type(exc).__name__}: {exc}; {HINT}") from exc
    except MemoryError:
        raise
    except Exception as exc:  # a hostile file must never escape as anything but ArtifactError
        _corrupt_first(checks, exc)
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
