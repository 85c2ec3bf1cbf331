"""Save a compiled model's parts into a ``.fgm`` file, and read them back checked.

``save`` writes the header (versions, machine, config), the graph and report JSON and the
weights; ``read`` checks everything a file says (``container``, ``machine``, ``weights``,
``plan``; the graph is rebuilt and verified, each node's stored output dtypes and shapes
against what the op registry infers from its inputs and attributes, so a re-sealed edit of a
convolution's pads or a node's inputs is refused at load) and returns a ``StoredModel``: pure data, which
the compiler binds (``fusegraph.load``). Every fault is an ``ArtifactError``; ``refusal``
turns a fault found while binding into one. Nothing here imports the compiler.
"""
from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config_file import config_from_mapping
from ..errors import ArtifactError, FusegraphError, VerifyError
from ..ir import Graph
from ..ir.serialize import graph_from_dict, graph_to_dict
from ..ops import infer_node
from ..plan.exec_plan import ExecutionPlan
from ..report.compile_report import CompileReport
from ..report.version import FUSEGRAPH_VERSION
from ..runtime.backends import stored_plain
from ..config import machine_cores
from .container import FORMAT_VERSION, Checksums, is_int, json_value, open_artifact, pack, want as _want
from .machine import HINT, check_machine as _check_machine, cpu_requirements, machine
from .plan import plan_record, restore_plan
from .weights import read_weights, weights_part

_MAX_JSON_PART = 1 << 30


# ----- save / load -----------------------------------------------------------------------------
def _jsonable(o: Any) -> Any:
    """What ``json.dumps`` makes of a value the report's ``to_dict`` left in a pass's stats."""
    if hasattr(o, "item") and callable(o.item):
        try:
            return o.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def save(path: str | Path, name: str, graph: Graph, config, report: CompileReport,
         plan: ExecutionPlan | None, strides: dict, backend_state: dict | None = None) -> None:
    """Write a compiled model (its optimised ``graph``, ``config``, ``report``, ``plan``, the
    arena view ``strides`` its binding probed, and its backend's ``export_state()``) to
    ``path`` as a ``.fgm`` artifact."""
    try:
        graph.verify()
    except FusegraphError as exc:
        raise ArtifactError(f"cannot save {name}: the graph is broken: {exc}") from None
    data, tensors = graph_to_dict(graph)
    here = machine()
    weights_dev = "cuda" if any(t.is_cuda for t in tensors.values()) else "cpu"
    on_cuda = weights_dev == "cuda" or config.device == "cuda"
    report = {"report": report.to_dict(), **(plan_record(plan, strides) or {"plan": None})}
    cap = here["capability"]
    header = {
        "format": "fusegraph-artifact", "format_version": FORMAT_VERSION, "byteorder": sys.byteorder,
        "fusegraph_version": FUSEGRAPH_VERSION, "torch_version": torch.__version__,
        "python_version": platform.python_version(), "model": name,
        "device": {"kind": "cuda", "capability": here["cuda"], "weights": weights_dev} if on_cuda
        else {"kind": "cpu", "weights": "cpu"},
        "cpu": {"arch": here["arch"], "capability": cap,
                "requires": cpu_requirements(cap, here["flags"])},
        "config": config.to_dict(),
    }
    parts = {"graph": json.dumps(data, separators=(",", ":"), allow_nan=False).encode(),
             "report": json.dumps(report, separators=(",", ":"), default=_jsonable).encode(),
             "weights": weights_part(tensors, (backend_state or {}).get("packed"))}
    pack(path, header, parts)


def _report(data: Any, where: str) -> CompileReport:
    """The stored report as the record a compile makes (``CompileReport.from_dict``: every part
    typed and checked; a malformed one is refused naming it)."""
    _want(isinstance(data, dict) and isinstance(data.get("report"), dict), f"{where}: report is malformed")
    try:
        return CompileReport.from_dict(data["report"])
    except ArtifactError as exc:
        raise ArtifactError(f"{where}: the stored report is malformed: {exc}") from None


def _corrupt_first(checks: Checksums | None, exc: Exception) -> None:
    """A fault found while the weights were still being hashed: when their digests do not
    match, that is the cause to report (a flipped byte, not whatever it made fail)."""
    if checks is not None:
        try:
            checks.finish()
        except ArtifactError as bad:
            raise bad from exc


def _threads(mapping: Any, threads: int | None, where: str) -> tuple[Any, int | None]:
    """The stored config with its thread count bounded by this machine's cores (or replaced by
    ``threads``), and the stored count when it was changed (``load_info["threads_stored"]``)."""
    _want(isinstance(mapping, dict), f"{where}: config is malformed")
    stored = mapping.get("threads")
    _want(stored is None or (is_int(stored) and stored >= 1), f"{where}: config threads {str(stored)[:20]!r} "
                                                               f"is not a positive integer")
    want = threads if threads is not None else (None if stored is None else min(stored, machine_cores()))
    return {**mapping, "threads": want}, (stored if want != stored else None)


@dataclass
class StoredModel:
    """What an artifact holds, checked: everything ``CompiledModel.from_optimized`` binds, the
    backend state (packed weight forms, each checked against its bytes by the backend's
    ``import_state``), and where it came from."""
    graph: Graph
    config: Any
    report: CompileReport
    plan: ExecutionPlan | None
    strides: dict
    backend_state: dict | None    # the packed weight forms (None: none stored)
    info: dict


def refusal(where: str, exc: Exception) -> ArtifactError:
    """The ArtifactError for a fault found while binding a stored model (the file said
    something its graph or this machine cannot honour)."""
    if isinstance(exc, ArtifactError):
        return exc
    if isinstance(exc, FusegraphError):    # ConfigError, UnsupportedOpError ...
        return ArtifactError(f"{where}: artifact refused: {type(exc).__name__}: {exc}; {HINT}")
    return ArtifactError(f"{where}: malformed artifact: {type(exc).__name__}: {exc}")


def read(path: str | Path, *, threads: int | None = None) -> StoredModel:
    """Read and check a ``.fgm`` artifact: no pass and no planning runs; the file is read once,
    into private memory, and not touched again. The stored ``Config.threads`` is bounded by
    this machine's cores, or replaced by ``threads`` when given."""
    where = str(path)
    checks = None
    try:
        art = open_artifact(Path(path))
        header = art.header
        _check_machine(header, machine(), where)
        checks = Checksums(art).start(later=("weights",))   # the weights hash on worker threads
        stored_config, stored_threads = _threads(header["config"], threads, where)
        config = config_from_mapping(stored_config, f"{where}: config")
        tensors, packed = read_weights(art.mm, *art.span("weights"), where, config.fold_broadcast_limit)
        blobs = {}
        for name in ("graph", "report"):
            start, length = art.span(name)
            _want(length <= _MAX_JSON_PART, f"{where}: part {name!r} declares absurd length {length}")
            blobs[name] = json_value(art.mm[start:start + length], where, f"part {name!r}")
        graph = graph_from_dict(blobs["graph"], tensors)
        try:     # every node's stored output types are what the op makes of its inputs and attributes
            graph.verify(infer=infer_node)
        except VerifyError as exc:
            raise ArtifactError(f"{where}: the stored graph fails verify() (corrupt or tampered "
                                f"file): {exc}") from None
        names = graph.meta.get("output_names")  # the runtime reads it: it must name each output once
        _want(names is None or (isinstance(names, list) and len(names) == len(graph.outputs) and
                                all(isinstance(n, str) for n in names) and len(set(names)) == len(names)),
              f"{where}: graph meta 'output_names' does not name each output once")
        on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
        if header["device"].get("kind") != "cpu" or not on_cpu:   # no CPU backend takes the forms
            for v in graph.constants.values():
                if v.const.device.type == "meta":
                    v.const = stored_plain(v, packed[v.name], where)
        report = _report(blobs["report"], where)
        plan, strides = restore_plan(blobs["report"], graph, where)
        checks, pending = None, checks
        pending.finish()                   # every digest matched: the weights may be bound
        if header["device"].get("weights") == "cuda":  # where the compiled model kept them
            for v in graph.constants.values():
                v.const = v.const.to("cuda")
        state = {"packed": packed} if packed else None
    except MemoryError:
        raise
    except Exception as exc:  # a hostile file must never escape as anything but ArtifactError
        _corrupt_first(checks, exc)
        raise refusal(where, exc) from exc
    info = {"path": where, "format_version": header["format_version"], "threads": config.threads,
            "threads_stored": stored_threads,
            "built_with": {k: header.get(k) for k in ("fusegraph_version", "torch_version")}}
    return StoredModel(graph, config, report, plan, strides, state, info)
