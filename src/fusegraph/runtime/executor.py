"""``Executor``: runs the generated function on validated feeds and returns NumPy outputs.

Kernel failures surface as ``KernelError`` naming the node and op, found through the line
map of the generated source, so the hot path carries no per-node bookkeeping.
"""
from __future__ import annotations

import traceback
from typing import Any, Mapping

import torch

from ..errors import FusegraphError, KernelError
from ..ir import Graph
from .bind import bind_kernels
from .codegen import GeneratedCode, generate_run_function
from .convert import to_numpy
from .feeds import convert_feeds


class Executor:
    def __init__(self, graph: Graph, model_name: str):
        self.graph = graph
        self.model_name = model_name
        self.inputs = list(graph.inputs)
        names = graph.meta.get("output_names") or [v.name for v in graph.outputs]
        self.output_names = list(names)
        self.code: GeneratedCode = generate_run_function(
            graph, bind_kernels(graph), filename=f"<fusegraph:{graph.name}>")
        self._const_ptrs = {v.const.data_ptr() for v in graph.constants.values() if v.const.numel()}

    def run_tensors(self, tensors: list[torch.Tensor]) -> tuple:
        try:
            with torch.inference_mode():
                return self.code.function(*tensors)
        except FusegraphError:
            raise
        except Exception as exc:
            raise self._kernel_error(exc) from exc

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        tensors = convert_feeds(self.model_name, self.inputs, feeds)
        outs = self.run_tensors(tensors)
        shared = self._const_ptrs | {t.data_ptr() for t in tensors if t.numel()}
        result = {}
        for name, t in zip(self.output_names, outs):
            if t.numel() and (t._base is not None or t.data_ptr() in shared):
                t = t.clone()
            result[name] = to_numpy(t)
        return result

    def _kernel_error(self, exc: Exception) -> KernelError:
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if frame.filename == self.code.filename:
                node = self.code.line_to_node.get(frame.lineno)
                if node is not None:
                    ins = ", ".join("_" if v is None else f"{v.name}: {v.type_str()}" for v in node.inputs)
                    return KernelError(f"{self.model_name}: node {node.name!r} ({node.op_type}) failed "
                                       f"with inputs ({ins}): {type(exc).__name__}: {exc}")
        return KernelError(f"{self.model_name}: run failed: {type(exc).__name__}: {exc}")
