"""``CompiledModel``: what users hold after ``fusegraph.compile`` or ``fusegraph.load``: ``run``,
``inputs``, ``outputs``, ``report``, ``save``, ``close``; and ``TensorSpec``, an input or output as
users see it.

A compiled model binds its optimised graph and plan once (``runtime.executor.Executor``) and
runs the generated code; a model with symbolic input dims hands a run to its per-shape
compile (``specialize.py``). It runs no pass and plans nothing itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from .. import artifact
from ..config import Config
from ..errors import ConfigError, ModelClosedError
from ..ir import DType, Graph
from ..ir.shape import Shape
from ..plan.exec_plan import ExecutionPlan
from ..report import CompileReport
from ..runtime.bind import kernel_summary
from ..ops.run_limits import RunLimits
from ..runtime.executor import Executor
from ..runtime.run_control import CancelToken, tokens_for
from ..runtime.threads import intra_op_threads


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as users see it."""
    name: str
    shape: Shape
    dtype: DType


def device_of(config: Config) -> str:
    """The device a model compiled with ``config`` runs on ("auto": CUDA where available)."""
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


class CompiledModel:
    def __init__(self, graph: Graph, config: Config, report: CompileReport, plan: ExecutionPlan | None = None,
                 strides: dict | None = None, backend_state: dict | None = None, shared_forms=None,
                 planner=None):
        self.graph = graph
        self.specializations = None   # ShapeSpecializations   # per-shape compiles (compile() sets it)
        self.config = config
        self.report = report
        self.plan = plan
        self.name = str(graph.meta.get("source", graph.name))
        device = device_of(config)
        if config.cuda_graph and device != "cuda":
            raise ConfigError(f"{self.name}: Config.cuda_graph captures a CUDA graph, but the model runs on "
                              f"{device!r}; drop cuda_graph or use device='cuda'")
        with intra_op_threads(config.threads):    # kernels bind at the thread count they run at
            self._executor = Executor(graph, self.name, plan, device=device, threads=config.threads,
                                      cuda_graph=config.cuda_graph, strides=strides,
                                      keep_freed_memory=config.keep_freed_memory,
                                      backend_state=backend_state, exact=not config.fast_math,
                                      cpu_kernels=config.cpu_kernels, shared_forms=shared_forms,
                                      planner=planner, declared_shapes=config.declared_shapes(),
                                      thread_policy=config.thread_policy,
                                      limits=RunLimits(config.run_bytes_cap, config.max_loop_iterations))
        binding = self._executor.binding
        if report.memory is not None:
            report.memory.not_writable_into_arena = list(binding.not_writable)
        frames = getattr(self._executor.frame_runner, "frames", None) if plan is not None and plan.symbolic \
            and device == "cpu" else None
        if frames is not None:        # ``report.memory``: the newest plan of a bucket of shapes
            frames.on_plan = lambda mplan: setattr(self.report, "memory", mplan.report)
        report.shape_kernels = self._executor.code.shape_kernels
        report.kernel_count = len(graph.nodes) - report.shape_kernels
        report.kernels = {**kernel_summary(binding), "weights_released_bytes": self._executor.released_bytes,
                          "weight_reorders": getattr(self._executor.backend, "reorders", 0)}

    @classmethod
    def from_optimized(cls, graph: Graph, config: Config, report: CompileReport,
                       plan: ExecutionPlan | None = None, strides: dict | None = None,
                       backend_state: dict | None = None, shared_forms=None, planner=None) -> "CompiledModel":
        """Bind an already optimised and planned graph: runs no pass and no planning
        (without a stored ``plan``, every tensor gets its own allocation, as memory "off";
        ``strides``: the arena view layouts the compile's probe found, so binding probes nothing)."""
        return cls(graph, config, report, plan, strides, backend_state, shared_forms, planner)

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
        ``config.threads`` intra-op threads when set (the caller's setting is restored), fewer
        where other processes keep cores busy (``Config.thread_policy``, ``threads_used``).

        ``timeout`` (seconds, counted from this call, the wait for another run of the model
        included) and ``cancel`` (a ``fusegraph.CancelToken``; ``token.cancel()`` from any
        thread) stop the run between two kernels or two Loop / Scan iterations: it raises
        ``RunDeadlineExceeded`` (a ``TimeoutError``) or ``RunCancelled``, and the model is
        ready for its next run. A kernel already running finishes first.

        ``hook(index, phase, outputs)`` (debugging) runs a variant of the generated code that
        calls it before (phase 0) and after (phase 1, with the node's output tensors) the
        node at ``index`` of ``plan.order``, on the thread that runs the node.

        A model with symbolic input dims runs every shape on this one compile (frames,
        ``runtime/frames.py``); with ``Config.shape_cache`` > 0 it runs instead its compile at
        the feeds' exact shapes (``specialize.py``), made on the first run at those shapes, and
        ``hook``'s index is into that compile's ``plan.order`` (``model.specialize(shapes)``)."""
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

    @property
    def threads_used(self) -> dict[int, int]:
        """Runs so far per intra-op thread count (``Config.thread_policy``)."""
        return dict(self._executor.threads_used)

    def memory_buckets(self) -> list[dict]:
        """For a model with symbolic input dims: the memory plans its runs made so far (one per
        bucket of shapes, ``plan/buckets.py``): the dims each was made for, the largest dims it
        ran, its arena and the lower bound at the largest shape it ran. [] for a static model."""
        frames = self._frames()
        return frames.report() if frames is not None else []

    def frame_stats(self) -> dict:
        """For a model with symbolic input dims: what its runs at new input shapes cost so far
        (``runtime/frames.py``): ``frames`` made at a run's miss and ``frames_ahead`` made for a
        decoder's next steps, with ``frame_seconds`` they took (plans included), ``plans`` made
        and their ``plan_seconds``. {} for a static model."""
        frames = self._frames()
        return dict(frames.stats) if frames is not None else {}

    def _frames(self):
        """The frame builder of a model with symbolic input dims (``runtime/frames.py``), else None."""
        return getattr(getattr(self._executor, "_runner", None), "frames", None)

    def kv_cache(self, capacity: int = 1024):
        """A session that runs this decoder step by step with its KV cache kept inside
        fusegraph (``runtime/kv_cache.py``): each ``present`` output made as ``Concat(past,
        new)`` grows a buffer with room for ``capacity`` positions (twice as much when a step
        needs more) instead of copying the cache, and feeds the next step's ``past`` input
        itself. ``session.run(feeds)`` takes the other inputs and returns the other outputs;
        ``session.reset()`` starts a new sequence. A ``ConfigError`` where the model has no such
        pair or no symbolic input dim."""
        from ..runtime.kv_cache import KVSession, kv_pairs
        if self._executor.closed:
            raise ModelClosedError(f"{self.name}: the model was closed; compile or load it again to run it")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError(f"{self.name}: kv_cache capacity must be a positive integer, got {capacity!r}")
        pairs, _ = kv_pairs(self.graph, self._executor.output_names)
        return KVSession(self._executor, pairs, capacity)

    def close(self) -> None:
        """Stop the stream workers now (they also stop when the model is garbage-collected);
        ``run`` raises ``ModelClosedError`` afterwards (the per-shape compiles are closed too)."""
        self._executor.close()
        if self.specializations is not None:
            self.specializations.close()
