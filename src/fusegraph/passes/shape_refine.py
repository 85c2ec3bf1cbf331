"""Shape refinement: re-run shape inference where rewrites made inputs more precise.

Folding turns values into constants of static shape, but the shapes recorded downstream were
inferred before, when those dims were still unknown or symbolic (onnx's ``unk__N``). This
pass re-infers every node whose inputs changed since its last visit and keeps a dim only when
it becomes more precise: an int replaces a symbol or an unknown, a symbol replaces an
unknown, a known rank replaces an unknown one. Nothing ever becomes less precise, so it converges.
"""
from __future__ import annotations

from ..ir import DType, Graph
from ..ops import infer_node
from .manager import PassResult


def _rank(d) -> int:
    """Precision of a dim: int > symbol > unknown. Symbols never replace symbols: the
    frontend's and the registry's names differ, and mixing them would break equalities."""
    return 2 if isinstance(d, int) else (0 if d is None else 1)


def _refine(old, new):
    if new is None:
        return old
    if old is None or len(old) != len(new):
        return new if old is None else old
    return tuple(n if _rank(n) > _rank(o) else o for o, n in zip(old, new))


class ShapeRefine:
    name = "shape_refine"

    def __init__(self, options=None):
        self.options = options
        self._seen: dict[int, tuple] = {}

    def run(self, graph: Graph) -> PassResult:
        refined = 0
        for node in graph.nodes:
            sig = tuple(None if v is None else (id(v), v.shape, v.dtype, v.is_const) for v in node.inputs)
            if self._seen.get(id(node)) == (node, sig):
                continue
            self._seen[id(node)] = (node, sig)
            try:
                inferred = infer_node(node)
            except Exception:
                continue
            for out, (dtype, shape) in zip(node.outputs, inferred or ()):
                new_shape = _refine(out.shape, shape)
                new_dtype = DType(dtype) if out.dtype == DType.UNDEFINED and dtype else out.dtype
                if new_shape != out.shape or new_dtype != out.dtype:
                    out.shape, out.dtype = new_shape, new_dtype
                    refined += 1
        return PassResult(refined > 0, {"values_refined": refined} if refined else {})
