"""The driver: ``compile()`` runs frontend -> inference -> passes -> plan -> kernel binding;
``load()`` reads a ``.fgm`` artifact and binds it with no pass and no planning.

This file holds no algorithm of its own; every stage lives in its package, the planning
sequence in ``planning.py``, the model users hold in ``model.py``.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .. import artifact
from ..config import Config
from ..errors import ArtifactError, ConfigError, ModelLoadError, UsageError
from ..ir import Graph
from ..ir.serialize import copy_graph
from ..ops import infer_graph, opdef_for
from ..passes import optimize
from ..report import CompileReport
from ..runtime.backends import weight_share
from ..runtime.threads import intra_op_threads
from .model import CompiledModel, device_of
from .planning import bucket_planner, has_symbolic_inputs, plan_and_bind
from .specialize import ShapeSpecializations, specialization_kind


def import_model(model: Any, example_inputs: Any = None, dynamic_shapes: Any = None) -> Graph:
    if isinstance(model, Graph):
        return model
    from ..frontends.dispatch import import_other  # torch, TensorFlow, "file.py:factory"
    graph = import_other(model, example_inputs, dynamic_shapes)
    if graph is not None:
        return graph
    if isinstance(model, (str, Path, bytes, bytearray)) or type(model).__name__ == "ModelProto":
        from ..frontends.onnx import import_onnx
        return import_onnx(model)
    raise ModelLoadError(f"cannot compile a {type(model).__name__}: give an ONNX path, bytes, an "
                         f"onnx.ModelProto or a fusegraph Graph")


def check_arguments(model: Any, config: Config, example_inputs: Any, dynamic_shapes: Any, calibration: Any) -> None:
    """Refuse an argument that would change nothing (a ``UsageError`` saying what it applies to):
    ``calibration_inputs`` outside ``precision="auto"`` / ``"int8"``; ``example_inputs`` / ``dynamic_shapes``
    with a model that is not a torch module or ExportedProgram (an ONNX file, a TensorFlow
    model, a graph: its input shapes are its own)."""
    if calibration is not None and config.precision not in ("auto", "int8"):
        raise UsageError(f"calibration_inputs apply to precision='auto' (its accuracy search) or 'int8' (the "
                         f"activations' ranges); precision={config.precision!r} uses none: drop them or ask for "
                         f"'auto' or 'int8'")
    if example_inputs is None and dynamic_shapes is None:
        return
    import torch
    if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        given = " and ".join(n for n, v in (("example_inputs", example_inputs), ("dynamic_shapes", dynamic_shapes))
                             if v is not None)
        raise UsageError(f"{given} apply to a torch module or ExportedProgram; a {type(model).__name__} model "
                         f"brings its own input shapes (an ONNX model's dynamic axes are its symbolic dims)")


def check_op_precision(graph: Graph, config: Config) -> None:
    """Every ``Config.op_precision`` key names a node or an op type of the imported model (or a
    fused op type: ``FusedConv``, ``LinearAct`` ...); otherwise a ConfigError naming them."""
    if not config.op_precision:
        return
    from ..ops.registry import registered_ops
    known = {n.name for n in graph.nodes} | {n.op_type for n in graph.nodes}
    known |= {op for domain, op, _ in registered_ops() if domain == "fusegraph"}
    unknown = [k for k, _ in config.op_precision if k not in known]
    if unknown:
        raise ConfigError(f"{graph.meta.get('source', graph.name)}: Config.op_precision names "
                          f"{', '.join(map(repr, unknown))}, which is no node name or op type of the model")


def compile(model: Any, config: Config | None = None, *,  # noqa: A001 - public API name
            on_stage: Callable[[str], None] | None = None, example_inputs: Any = None,
            dynamic_shapes: Any = None, calibration_inputs: Any = None) -> CompiledModel:
    """Compile an ONNX model (path, bytes, ModelProto) or an IR Graph into a CompiledModel.

    ``on_stage(name)`` is called as each stage starts: "import", "passes", "planning".
    ``calibration_inputs``: for ``precision="auto"``, a list of feeds (``{input: array}``) the
    accuracy search measures on (default: random inputs of the model's input specs); for
    ``precision="int8"``, the feeds the activations' ranges are calibrated on (without them:
    dynamic quantisation of the MatMul / Gemm products, ``int8_ptq.py``).
    """
    config = config or Config()
    check_arguments(model, config, example_inputs, dynamic_shapes, calibration_inputs)
    with intra_op_threads(config.threads):   # the caller's thread count is back when this returns
        return _compile(model, config, on_stage or (lambda name: None), example_inputs, dynamic_shapes,
                        calibration_inputs)


def _compile(model: Any, config: Config, stage: Callable[[str], None], example_inputs: Any,
             dynamic_shapes: Any, calibration: Any) -> CompiledModel:
    t0 = time.perf_counter()
    stage("import")
    graph = import_model(model, example_inputs, dynamic_shapes)
    t1 = time.perf_counter()
    for node in graph.nodes:  # every node must have a kernel: fail at compile time, not run time
        opdef_for(node)
    infer_graph(graph)
    if config.dynamic_batch and config.shape_cache == 0:
        symbolic_batch(graph)              # one compile for every batch size
    check_op_precision(graph, config)
    check_declared_shapes(graph, config)
    report = CompileReport(model=str(graph.meta.get("source", graph.name)), nodes_imported=len(graph.nodes))
    ptq, t_quantise = None, time.perf_counter()
    if config.precision == "int8":         # before any copy: a per-shape compile starts from the quantised graph
        from .int8_ptq import quantise
        ptq = quantise(graph, config, report, calibration, stage)
        report.timings["quantise"] = time.perf_counter() - t_quantise
    kind = specialization_kind(graph, config)
    source = copy_graph(graph) if kind == "batch" else None     # a static graph, before any pass
    t_infer = time.perf_counter()
    stage("passes")
    if config.precision == "auto":
        from .precision_auto import search
        search(graph, config, report, calibration, stage)   # optimises the graph at the chosen policy
    else:
        optimize(graph, config, report)
    if ptq is not None:
        report.precision = ptq.summary(graph, report)
    if kind == "shapes":
        source = copy_graph(graph)        # optimised, shape-generic: each compile folds its shapes
    t2 = time.perf_counter()
    stage("planning")
    shared = weight_share(device_of(config)) if kind else None
    compiled = plan_and_bind(graph, config, report, shared)
    # verify (in passes) came first, then plan and bind
    report.timings = {"import": t1 - t0, "infer": t_infer - t1 - report.timings.get("quantise", 0.0),
                      "passes": t2 - t_infer, **report.timings}
    if kind:
        _attach_specializations(compiled, source, kind, shared)
    return compiled


def symbolic_batch(graph: Graph) -> None:
    """``Config.dynamic_batch``: every tensor input's dim 0 becomes the symbolic ``batch``; the
    graph is inferred again (an output whose batch the graph fixes keeps a constant dim 0, and
    is refused at another batch: ``graph.meta["fixed_batch"]``)."""
    first = next((v.shape[0] for v in graph.inputs if v.shape and isinstance(v.shape[0], int)), None)
    for v in graph.inputs:
        if v.shape and "container" not in v.meta:
            v.shape = ("batch", *v.shape[1:])
    infer_graph(graph)
    names = graph.meta.get("output_names") or [v.name for v in graph.outputs]
    fixed = [n for n, v in zip(names, graph.outputs) if v.shape and isinstance(v.shape[0], int)]
    if fixed and first is not None:
        graph.meta["fixed_batch"] = {"batch": int(first), "outputs": fixed}


def check_declared_shapes(graph: Graph, config: Config) -> None:
    """Every dim ``Config.shapes`` declares is a symbolic dim of the model's inputs."""
    if not config.shapes:
        return
    symbols = {d for v in graph.inputs for d in (v.shape or ()) if isinstance(d, str)}
    unknown = [name for name, _, _ in config.shapes if name not in symbols]
    if unknown:
        raise ConfigError(f"{graph.meta.get('source', graph.name)}: Config.shapes declares "
                          f"{', '.join(map(repr, unknown))}, which is no symbolic dim of the model's inputs "
                          f"(they are: {', '.join(map(repr, sorted(symbols))) or 'none'})")


def _attach_specializations(model: CompiledModel, source: Graph, kind: str, shared) -> None:
    config = model.config
    model.specializations = ShapeSpecializations(
        source, kind, config, model, shared, lambda g, cfg: plan_and_bind(g, config, _optimized(g, cfg), shared))


def _optimized(graph: Graph, config: Config) -> CompileReport:
    report = CompileReport(model=str(graph.meta.get("source", graph.name)), nodes_imported=len(graph.nodes))
    optimize(graph, config, report)
    return report


def load(path: str | Path, *, threads: int | None = None) -> CompiledModel:
    """Load a ``.fgm`` artifact (``artifact.read``) and bind its kernels: no pass and no
    planning runs. The model runs at the stored ``Config.threads`` bounded by this machine's
    cores, or at ``threads``; the process's own thread count is left as it was. A model with
    symbolic input dims compiles at each new input shape on its first run there, from the
    stored shape-generic graph, as a compiled one does (``specialize.py``)."""
    t0 = time.perf_counter()
    stored = artifact.read(path, threads=threads)
    dynamic = specialization_kind(stored.graph, stored.config) == "shapes"   # not "batch": its batch is folded
    shared = weight_share(device_of(stored.config)) if dynamic else None
    plan, planner = stored.plan, None
    symbolic = has_symbolic_inputs(stored.graph) and device_of(stored.config) == "cpu" and plan is not None
    if plan is not None and plan.symbolic != symbolic:     # the graph decides, not the file's word
        raise artifact.refusal(str(path), ArtifactError(
            f"{path}: the stored plan is {'' if plan.symbolic else 'not '}for a range of input shapes, but the "
            f"graph's inputs are {'symbolic' if symbolic else 'static'}: a re-sealed or corrupt file"))
    if symbolic:
        planner = bucket_planner(stored.graph, stored.config, plan)
    try:
        source = copy_graph(stored.graph) if dynamic else None                # before binding changes it
        model = CompiledModel.from_optimized(stored.graph, stored.config, stored.report, plan,
                                             stored.strides, stored.backend_state, shared, planner)
    except MemoryError:
        raise
    except Exception as exc:  # a file whose graph or plan cannot be bound: ArtifactError, never other
        raise artifact.refusal(str(path), exc) from exc
    if dynamic:
        _attach_specializations(model, source, "shapes", shared)
    seconds = time.perf_counter() - t0
    stored.report.timings["load"] = seconds
    reorders = model.report.kernels.get("weight_reorders", 0)
    model.load_info = {**stored.info, "seconds": seconds, "weight_reorders": reorders,
                       "backend_state": ("stored forms used as they are" if not reorders else
                                         f"{reorders} weight(s) reordered for this machine's kernels")
                       if stored.backend_state else "none stored"}
    return model
