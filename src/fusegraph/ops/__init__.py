"""The op registry and every registered op family.

Importing this package registers all kernels. Per-op facts (schema, inference, purity,
fusion kind, layout sensitivity, data-movement class, precision class, value-range transfer,
kernel) live in the family modules, never in passes.
"""
from .registry import (FusionKind, Movement, NodeContext, OpDef, Precision, lookup, movement_ops, newest, opdef_for,
                       register, registered_ops)
from .infer import infer_graph, infer_node
from . import families  # noqa: F401  (registers every op family)

__all__ = ["FusionKind", "Movement", "NodeContext", "OpDef", "Precision", "lookup", "movement_ops", "newest",
           "opdef_for", "register", "registered_ops", "infer_graph", "infer_node"]
