"""The driver: ``compile()`` runs frontend -> inference -> passes -> plan -> kernel binding.

Planning (``_plan``): the memory plan (``plan_memory``: order, lifetimes, arena offsets; in
``tight`` mode the order is the planner's, and the runtime generates code in that order), then,
for more than one stream, the stream plan on that order and the memory plan again with the
stream hooks (a buffer is reused only across an event or within a stream). The result is an
``ExecutionPlan`` (pure data, ``model.plan``), which the executor binds.

``CompiledModel`` is what users hold: ``run``, ``inputs``, ``outputs``, ``report``. This file
holds no algorithm of its own; every stage lives in its package.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from . import artifact
from .config import Config
from .errors import ConfigError, ModelClosedError, ModelLoadError
from .ir import DType, Graph
from .ir.serialize import copy_graph
from .ir.shape import Shape
from .ops import infer_graph, opdef_for
from .passes import optimize
from .report import CompileReport
from .plan.exec_plan import ExecutionPlan
from .plan.memory_plan import PlanOptions, plan_memory
from .runtime.bind import kernel_summary
from .runtime.executor import Executor
from .runtime.run_control import CancelToken, tokens_for
from .ops.run_limits import RunLimits
from .runtime.backends.cpu.dnnl.weights import SharedForms
from .runtime.threads import intra_op_threads
from .specialize import ShapeSpecializations, specialization_kind

@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as users see it."""
    name: str
    shape: Shape
    dtype: DType


def _import(model: Any, example_inputs: Any = None, dynamic_shapes: Any = None) -> Graph:
    if isinstance(model, Graph):
        return model
    from .frontends.dispatch import import_other  # torch, TensorFlow, "file.py:factory"
    graph = import_other(model, example_inputs, dynamic_shapes)
    if graph is not None:
        return graph
    if isinstance(model, (str, Path, bytes, bytearray)) or type(model).__name__ == "ModelProto":
        from .frontends.onnx import import_onnx
        return import_onnx(model)
    raise ModelLoadError(f"cannot compile a {type(model).__name__}: give an ONNX path, bytes, an "
                         f"onnx.ModelProto or a fusegraph Graph")


def check_op_precision(graph: Graph, config: Config) -> None:
    """Every ``Config.op_precision`` key names a node or an op type of the imported model (or a
    fused op type: ``FusedConv``, ``LinearAct`` ...); otherwise a ConfigError naming them."""
    if not config.op_precision:
        return
    from .ops.registry import registered_ops
    known = {n.name for n in graph.nodes} | {n.op_type for n in graph.nodes}
    known |= {op for domain, op, _ in registered_ops() if domain == "fusegraph"}
    unknown = [k for k, _ in config.op_precision if k not in known]
    if unknown:
        raise ConfigError(f"{graph.meta.get('source', graph.name)}: Config.op_precision names "
                          f"{', '.join(map(repr, unknown))}, which is no node name or op type of the model")


def _device(config: Config) -> str:
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


class CompiledModel:
    def __init__(self, graph: Graph, config: Config, report: CompileReport, plan: ExecutionPlan | None = None,
                 strides: dict | None = None, backend_state: dict | None = None, shared_forms=None):
        self.graph = graph
        self.specializations: ShapeSpecializations | None = None   # per-shape compiles (compile() sets it)
        self.config = config
        self.report = report
        self.plan = plan
        self.name = str(graph.meta.get("source", graph.name))
        device = _device(config)
        if config.cuda_graph and device != "cuda":
            raise ConfigError(f"{self.name}: Config.cuda_graph captures a CUDA graph, but the model runs on "
                              f"{device!r}; drop cuda_graph or use device='cuda'")
        with intra_op_threads(config.threads):    # kernels bind at the thread count they run at
            self._executor = Executor(graph, self.name, plan, device=device, threads=config.threads,
                                      cuda_graph=config.cuda_graph, strides=strides,
                                      keep_freed_memory=config.keep_freed_memory,
                                      backend_state=backend_state, exact=not config.fast_math,
                                      cpu_kernels=config.cpu_kernels, shared_forms=shared_forms,
                                      limits=RunLimits(config.run_bytes_cap, config.max_loop_iterations))
        binding = self._executor.binding
        if hasattr(report.memory, "not_writable_into_arena"):
            report.memory.not_writable_into_arena = list(binding.not_writable)
        report.shape_kernels = self._executor.code.shape_kernels
        report.kernel_count = len(graph.nodes) - report.shape_kernels
        report.kernels = {**kernel_summary(binding), "weights_released_bytes": self._executor.released_bytes,
                          "weight_reorders": getattr(self._executor.backend, "reorders", 0)}

    @classmethod
    def from_optimized(cls, graph: Graph, config: Config, report: CompileReport,
                       plan: ExecutionPlan | None = None, strides: dict | None = None,
                       backend_state: dict | None = None, shared_forms=None) -> "CompiledModel":
        """Bind an already optimised and planned graph: runs no pass and no planning
        (without a stored ``plan``, every tensor gets its own allocation, as memory "off";
        ``strides``: the arena view layouts the compile's probe found, so binding probes nothing)."""
        return cls(graph, config, report, plan, strides, backend_state, shared_forms)

    def save(self, path: str | Path) -> None:
        """Write the offline ``.fgm`` artifact (see ``fusegraph.artifact``)."""
        artifact.save(path, self.name, self.graph, self.config, self.report, self.plan,
                      getattr(self._executor.binding, "strides", None) or {},
                      self._executor.backend.export_state(self.graph))

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec(v.name, v.shape, v.dtype) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(n, v.shape, v.dtype) for n, v in zip(self._executor.output_names, self.graph.outputs)]

    @property
    def source(self) -> str:
        """The generated run function, as Python source."""
        return self._executor.code.source

    def run(self, feeds: Mapping[str, Any], *, hook=None, timeout: float | None = None,
            cancel: CancelToken | None = None) -> dict[str, Any]:
        """Run once: ``{input name: array}`` -> ``{output name: numpy array}``.

        Thread-safe: the model's own lock makes concurrent calls run one at a time. Runs at
        ``config.threads`` intra-op threads when set (the caller's setting is restored).

        ``timeout`` (seconds, counted from this call, the wait for another run of the model
        included) and ``cancel`` (a ``fusegraph.CancelToken``; ``token.cancel()`` from any
        thread) stop the run between two kernels or two Loop / Scan iterations: it raises
        ``RunDeadlineExceeded`` (a ``TimeoutError``) or ``RunCancelled``, and the model is
        ready for its next run. A kernel already running finishes first.

        ``hook(index, phase, outputs)`` (debugging) runs a variant of the generated code that
        calls it before (phase 0) and after (phase 1, with the node's output tensors) the
        node at ``index`` of ``plan.order``, on the thread that runs the node.

        A model with symbolic input dims (or ``Config.dynamic_batch``) runs its compile at the
        feeds' exact shapes (``specialize.py``), made on the first run at those shapes; ``hook``'s
        index is then into that compile's ``plan.order`` (``model.specialize(shapes)``)."""
        tokens = tokens_for(timeout, cancel)
        model = self.runs_as(feeds)
        return model._executor.run(feeds, hook=hook, tokens=tokens)

    def runs_as(self, feeds: Mapping[str, Any]) -> "CompiledModel":
        """The compile a run with ``feeds`` executes: this model, or for a model with symbolic
        input dims its compile at the feeds' shapes (made now if it is not kept; what reports,
        profiles and benchmarks should describe)."""
        if self.specializations is not None and not self._executor.closed:
            return self.specializations.model_for(feeds) or self
        return self

    def specialize(self, shapes: Mapping[str, tuple[int, ...]]) -> "CompiledModel":
        """The compile of this dynamic model at exact input shapes (``{input: shape}``), made now
        if it is not kept yet (so the first run at those shapes compiles nothing)."""
        if self.specializations is None:
            raise ConfigError(f"{self.name}: the model has no symbolic input dim to specialise (or "
                              f"Config.shape_cache is 0); Config.dynamic_batch lets a compiled static "
                              f"model take other batch sizes")
        if self._executor.closed:
            raise ModelClosedError(f"{self.name}: the model was closed; compile or load it again to run it")
        return self.specializations.at(shapes)

    def close(self) -> None:
        """Stop the stream workers now (they also stop when the model is garbage-collected);
        ``run`` raises ``ModelClosedError`` afterwards (the per-shape compiles are closed too)."""
        self._executor.close()
        if self.specializations is not None:
            self.specializations.close()


def _plan(graph: Graph, config: Config, report: CompileReport) -> ExecutionPlan:
    mplan = plan_memory(graph, config)
    streams = None
    if config.streams == "auto" or config.streams > 1:
        from .plan.streams import plan_streams
        from .plan.stream_memory import stream_hooks
        cost = None
        if config.streams == "auto" and _device(config) == "cpu":   # hybrid plans need measured costs
            from .runtime.stream_calibrate import calibrate_costs
            cost = calibrate_costs(graph, ExecutionPlan.from_memory_plan(mplan, config.memory),
                                   config.threads or torch.get_num_threads())
        sp = plan_streams(graph, list(mplan.order), config.streams, cost)
        if sp.num_streams > 1:
            streams = sp
            if config.memory != "off":
                release_after, inplace_ok = stream_hooks(graph, mplan.order, sp)
                mplan = plan_memory(graph, config, PlanOptions(order=tuple(mplan.order), release_after=release_after,
                                                               inplace_ok=inplace_ok))
        if report.streams is None:
            report.streams = sp
    report.memory = mplan.report
    return ExecutionPlan.from_memory_plan(mplan, config.memory, streams)


def compile(model: Any, config: Config | None = None, *,  # noqa: A001 - public API name
            on_stage: Callable[[str], None] | None = None, example_inputs: Any = None,
            dynamic_shapes: Any = None, calibration_inputs: Any = None) -> CompiledModel:
    """Compile an ONNX model (path, bytes, ModelProto) or an IR Graph into a CompiledModel.

    ``on_stage(name)`` is called as each stage starts: "import", "passes", "planning".
    ``calibration_inputs``: for ``precision="auto"``, a list of feeds (``{input: array}``) the
    accuracy search measures on (default: random inputs of the model's input specs).
    """
    config = config or Config()
    with intra_op_threads(config.threads):   # the caller's thread count is back when this returns
        return _compile(model, config, on_stage or (lambda name: None), example_inputs, dynamic_shapes,
                        calibration_inputs)


def _compile(model: Any, config: Config, stage: Callable[[str], None], example_inputs: Any,
             dynamic_shapes: Any, calibration: Any) -> CompiledModel:
    t0 = time.perf_counter()
    stage("import")
    graph = _import(model, example_inputs, dynamic_shapes)
    t1 = time.perf_counter()
    for node in graph.nodes:  # every node must have a kernel: fail at compile time, not run time
        opdef_for(node)
    infer_graph(graph)
    check_op_precision(graph, config)
    kind = specialization_kind(graph, config)
    source = copy_graph(graph) if kind == "batch" else None     # a static graph, before any pass
    report = CompileReport(model=str(graph.meta.get("source", graph.name)), nodes_imported=len(graph.nodes))
    stage("passes")
    if config.precision == "auto":
        from .precision_auto import search
        search(graph, config, report, calibration, stage)   # optimises the graph at the chosen policy
    else:
        optimize(graph, config, report)
    if kind == "shapes":
        source = copy_graph(graph)        # optimised, shape-generic: each compile folds its shapes
    t2 = time.perf_counter()
    stage("planning")
    shared = SharedForms() if kind else None
    compiled = _plan_and_bind(graph, config, report, shared)
    report.timings = {"import": t1 - t0, "infer": t2 - t1, **report.timings}    # then plan, bind
    if kind:
        _attach_specializations(compiled, source, kind, shared)
    return compiled


def _attach_specializations(model: CompiledModel, source: Graph, kind: str, shared: SharedForms) -> None:
    config = model.config
    model.specializations = ShapeSpecializations(
        source, kind, config, model, shared, lambda g, cfg: _plan_and_bind(g, config, _optimized(g, cfg), shared))


def _optimized(graph: Graph, config: Config) -> CompileReport:
    report = CompileReport(model=str(graph.meta.get("source", graph.name)), nodes_imported=len(graph.nodes))
    optimize(graph, config, report)
    return report


def _plan_and_bind(graph: Graph, config: Config, report: CompileReport, shared_forms=None) -> CompiledModel:
    """An optimised graph through the planner and binding (``shared_forms``: packed weights
    shared with the model's other per-shape compiles)."""
    t2 = time.perf_counter()
    report.nodes_final = len(graph.nodes)
    report.op_histogram = graph.op_histogram()
    plan = _plan(graph, config, report)
    t3 = time.perf_counter()
    compiled = CompiledModel(graph, config, report, plan, shared_forms=shared_forms)
    report.timings = {**report.timings, "plan": t3 - t2, "bind": time.perf_counter() - t3}
    return compiled


def load(path: str | Path, *, threads: int | None = None) -> CompiledModel:
    """Load a ``.fgm`` artifact (``artifact.read``) and bind its kernels: no pass and no
    planning runs. The model runs at the stored ``Config.threads`` bounded by this machine's
    cores, or at ``threads``; the process's own thread count is left as it was. A model with
    symbolic input dims compiles at each new input shape on its first run there, from the
    stored shape-generic graph, as a compiled one does (``specialize.py``)."""
    t0 = time.perf_counter()
    stored = artifact.read(path, threads=threads)
    dynamic = specialization_kind(stored.graph, stored.config) == "shapes"   # not "batch": its batch is folded
    shared = SharedForms() if dynamic else None
    try:
        source = copy_graph(stored.graph) if dynamic else None                # before binding changes it
        model = CompiledModel.from_optimized(stored.graph, stored.config, stored.report, stored.plan,
                                             stored.strides, stored.backend_state, shared)
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
