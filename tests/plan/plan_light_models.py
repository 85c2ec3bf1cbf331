"""The onnx package's light models as IR graphs for the planner tests.

``load_inferred`` is the real path (import + registry inference); it raises UnsupportedOpError
while some kernels are missing, and the tests skip. ``load_with_hints`` needs no kernel: it keeps
the shapes onnx's own inference gave the frontend, and stands in for constant folding by turning
``ConstantOfShape`` nodes (how the light models make their weights) into zero-stride constants
(this edits the test's own freshly imported graph, through the IR API).
"""
from __future__ import annotations

import glob
import os

import onnx
import torch

from fusegraph.frontends.onnx import import_onnx
from fusegraph.ir import DType, Graph

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(os.path.basename(p)[len("light_"):-len(".onnx")]
                      for p in glob.glob(os.path.join(LIGHT_DIR, "light_*.onnx")))
BRANCHY = ("inception_v1", "inception_v2", "densenet121", "squeezenet")


def light_path(name: str) -> str:
    return os.path.join(LIGHT_DIR, f"light_{name}.onnx")


def load_inferred(name: str) -> Graph:
    from fusegraph.ops import infer_graph
    graph = import_onnx(light_path(name))
    infer_graph(graph)
    return graph


def load_with_hints(name: str) -> Graph:
    graph = import_onnx(light_path(name))
    for node in [n for n in graph.nodes if n.op_type == "ConstantOfShape"]:
        shape_in = node.inputs[0]
        out = node.outputs[0]
        if shape_in is None or not shape_in.is_const:
            continue
        shape = [int(d) for d in shape_in.const.reshape(-1).tolist()]
        dtype = out.dtype.to_torch() if out.dtype != DType.UNDEFINED else torch.float32
        const = graph.add_constant(f"{out.name}_folded", torch.zeros((), dtype=dtype).expand(shape))
        out.replace_all_uses_with(const)
        graph.remove(node)
    return graph
