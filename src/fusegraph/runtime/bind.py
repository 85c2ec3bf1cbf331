"""Bind every node's kernel once, at compile time, through the op registry."""
from __future__ import annotations

from typing import Callable

from ..ir import Graph
from ..ops import opdef_for
from ..ops.registry import NodeContext


def bind_kernels(graph: Graph) -> dict[int, Callable]:
    """``id(node) -> kernel``; raises UnsupportedOpError naming the first node without one."""
    return {id(node): opdef_for(node).build(NodeContext(node)) for node in graph.nodes}
