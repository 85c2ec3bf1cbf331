"""Input / output counts of standard-domain nodes, checked against the ONNX op schemas.

The ONNX frontend refuses a malformed node at import; a graph built any other way (an IR
``Graph`` handed to ``compile``, a frontend of another framework, a re-sealed artifact) meets
this check in ``infer_graph``, so no pass or kernel indexes past a node's inputs. Ops outside
the standard domain (fusegraph's fused ops, custom domains) are not checked here. Knows no
frontend: it reads ``onnx.defs`` only, and skips the check when onnx is not installed. A
node's implicit inputs (outer values its bodies read, ``ir/subgraphs.py``) are not counted.
"""
from __future__ import annotations

from ..errors import ShapeInferenceError
from ..ir import Node
from ..ir.subgraphs import implicit_count


def _schema(node: Node):
    try:
        from onnx import defs
    except ImportError:          # pragma: no cover - onnx is a dependency of the package
        return None
    try:
        return defs.get_schema(node.op_type, max(int(node.version), 1), "")
    except (defs.SchemaError, TypeError, ValueError):
        return None


def check_arity(node: Node) -> None:
    """Raise ShapeInferenceError when a standard-domain node has too few or too many inputs
    or outputs for its op's schema, or leaves a required input empty."""
    if node.domain not in ("", "ai.onnx"):
        return
    schema = _schema(node)
    if schema is None:
        return
    n_in, n_out = len(node.inputs) - implicit_count(node), len(node.outputs)   # not the outer reads
    at = f"node {node.name!r} ({node.op_type}, opset {node.version})"
    if not schema.min_input <= n_in <= schema.max_input:
        raise ShapeInferenceError(f"{at} has {n_in} inputs; the op takes {_range(schema.min_input, schema.max_input)}")
    if not 1 <= n_out <= schema.max_output:
        raise ShapeInferenceError(f"{at} has {n_out} outputs; the op gives {_range(schema.min_output, schema.max_output)}")
    from onnx import defs
    single = defs.OpSchema.FormalParameterOption.Single
    for i, (v, formal) in enumerate(zip(node.inputs, schema.inputs)):
        if v is None and formal.option == single:
            raise ShapeInferenceError(f"{at}: input {i} ({formal.name}) is required but missing")


def _range(lo: int, hi: int) -> str:
    if hi >= 1 << 30:
        return f"at least {lo}"
    return f"{lo}" if lo == hi else f"{lo} to {hi}"
