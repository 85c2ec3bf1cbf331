"""Shape and dtype inference over the op registry.

``infer_node`` uses the op's own inference function when it has one; otherwise it runs the
op's kernel on ``meta`` tensors (no memory, no data) under ``torch.device("meta")``, twice
with different stand-in sizes for symbolic dims, and reads static, symbolic and unknown dims
off the two results. Kernels whose output shape depends on data yield an unknown shape.
``infer_graph`` fills every node output, keeping frontend hints where inference is blind.
"""
from __future__ import annotations

import torch

from ..errors import FusegraphError, ShapeInferenceError
from ..ir import DType, Graph, Node
from ..ir.shape import Shape
from .arity import check_arity
from .registry import NodeContext, opdef_for

# Stand-in sizes for symbolic / unknown dims in the two meta runs: distinct primes that no
# real model uses as a static dim, small enough that kernels looping over a dim stay cheap.
_STANDINS = ((1361, 1367, 1373, 1381, 1399, 1409, 1423, 1427, 1429, 1433, 1439, 1447),
             (1451, 1453, 1459, 1471, 1481, 1483, 1487, 1489, 1493, 1499, 1511, 1523))


def _meta_run(node: Node, kernel, run: int):
    symbols: dict[object, int] = {}
    args = []
    for v in node.inputs:
        if v is None:
            args.append(None)
            continue
        if v.is_const:
            args.append(v.const.to("meta"))
            continue
        if v.shape is None or v.dtype in (DType.UNDEFINED, DType.STRING):
            return None, None
        dims = []
        for k, d in enumerate(v.shape):
            if isinstance(d, int):
                dims.append(d)
            else:
                key = d if isinstance(d, str) else (v.name, k)
                if key not in symbols:
                    if len(symbols) >= len(_STANDINS[run]):
                        return None, None
                    symbols[key] = _STANDINS[run][len(symbols)]
                dims.append(symbols[key])
        args.append(torch.empty(dims, dtype=v.dtype.to_torch(), device="meta"))
    with torch.device("meta"):
        out = kernel(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return outs, {val: key for key, val in symbols.items()}


def _meta_infer(node: Node, build) -> list | None:
    try:
        kernel = build(NodeContext(node))
        outs_a, sym_a = _meta_run(node, kernel, 0)
        if outs_a is None:
            return None
        outs_b, _ = _meta_run(node, kernel, 1) if sym_a else (outs_a, {})
    except FusegraphError:
        raise
    except Exception:
        return None
    result = []
    for a, b in zip(outs_a, outs_b):
        if not isinstance(a, torch.Tensor):
            result.append((None, None))
            continue
        dims = []
        for da, db in zip(a.shape, b.shape):
            if da == db and da not in sym_a:
                dims.append(int(da))
            elif da in sym_a and isinstance(sym_a[da], str):
                dims.append(sym_a[da])
            else:
                dims.append(None)
        result.append((DType.from_torch(a.dtype), tuple(dims) if len(a.shape) == len(b.shape) else None))
    return result


def infer_node(node: Node) -> list[tuple[DType | None, Shape]] | None:
    """Inferred (dtype, shape) per output; None entries where it cannot tell."""
    opdef = opdef_for(node)
    if opdef.infer is not None:
        try:
            return opdef.infer(NodeContext(node))
        except FusegraphError:
            raise
        except (ValueError, IndexError, TypeError) as exc:
            raise ShapeInferenceError(f"node {node.name!r} ({node.op_type}): {exc}") from exc
    return _meta_infer(node, opdef.build)


def _merge(old: Shape, new: Shape) -> Shape:
    if new is None:
        return old
    if old is None or len(old) != len(new):
        return new
    return tuple(n if n is not None else o for o, n in zip(old, new))


def infer_graph(graph: Graph) -> None:
    """Fill dtype and shape of every node output, in order (after checking each standard-domain
    node's input and output counts against its ONNX schema: ``arity.py``, and that no op reads a
sequence or optional where it takes a tensor: ``sequence.py``)."""
    from .sequence import check_container_inputs
    for node in graph.nodes:
        check_arity(node)
        check_container_inputs(node)
        inferred = infer_node(node)
        if not inferred:
            continue
        for out, (dtype, shape) in zip(node.outputs, inferred):
            if dtype is not None and dtype != DType.UNDEFINED:
                out.dtype = dtype
            out.shape = _merge(out.shape, shape)
