"""The driver: ``compile()`` runs frontend -> inference -> passes -> kernel binding.

``CompiledModel`` is what users hold: ``run``, ``inputs``, ``outputs``, ``report``. This file
holds no algorithm of its own; every stage lives in its package.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from .config import Config
from .errors import ModelLoadError
from .ir import DType, Graph
from .ir.shape import Shape
from .ops import infer_graph, opdef_for
from .passes import optimize
from .report import CompileReport
from .runtime.executor import Executor

# How often compile() ran each stage; artifact.load reads it to show that loading ran none.
STAGE_RUNS = {"passes": 0, "plan": 0}


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as users see it."""
    name: str
    shape: Shape
    dtype: DType


def _import(model: Any) -> Graph:
    if isinstance(model, Graph):
        return model
    if isinstance(model, (str, Path, bytes, bytearray)) or type(model).__name__ == "ModelProto":
        from .frontends.onnx import import_onnx
        return import_onnx(model)
    raise ModelLoadError(f"cannot compile a {type(model).__name__}: give an ONNX path, bytes, an "
                         f"onnx.ModelProto or a fusegraph Graph")


class CompiledModel:
    def __init__(self, graph: Graph, config: Config, report: CompileReport):
        self.graph = graph
        self.config = config
        self.report = report
        self.name = str(graph.meta.get("source", graph.name))
        self._executor = Executor(graph, self.name)
        report.kernel_count = len(graph.nodes)

    @classmethod
    def from_optimized(cls, graph: Graph, config: Config, report: CompileReport) -> "CompiledModel":
        """Bind an already optimised (and planned) graph: runs no pass and no planning."""
        return cls(graph, config, report)

    def save(self, path: str | Path) -> None:
        """Write the offline ``.fgm`` artifact (see ``fusegraph.artifact``)."""
        from .artifact import save
        save(self, path)

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

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run once: ``{input name: array}`` -> ``{output name: numpy array}``."""
        return self._executor.run(feeds)


def compile(model: Any, config: Config | None = None) -> CompiledModel:  # noqa: A001 - public API name
    """Compile an ONNX model (path, bytes, ModelProto) or an IR Graph into a CompiledModel."""
    config = config or Config()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    t0 = time.perf_counter()
    graph = _import(model)
    report = CompileReport(model=str(graph.meta.get("source", graph.name)), nodes_imported=len(graph.nodes))
    t1 = time.perf_counter()
    for node in graph.nodes:  # every node must have a kernel: fail at compile time, not run time
        opdef_for(node)
    infer_graph(graph)
    STAGE_RUNS["passes"] += 1
    optimize(graph, config, report)
    t2 = time.perf_counter()
    report.nodes_final = len(graph.nodes)
    report.op_histogram = graph.op_histogram()
    compiled = CompiledModel(graph, config, report)
    report.timings = {"import": t1 - t0, "infer": t2 - t1, "bind": time.perf_counter() - t2}
    return compiled
