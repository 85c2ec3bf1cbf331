"""The fusegraph IR: ``Graph``, ``Node``, ``Value``, ``DType`` and symbolic shapes."""
from .dtype import DType
from .graph import Graph, is_broadcast
from .nodes import Node, Value
from .shape import Shape, broadcast_shapes, format_shape, is_static, numel

__all__ = ["DType", "Graph", "Node", "Value", "Shape", "broadcast_shapes", "format_shape",
           "is_broadcast", "is_static", "numel"]
