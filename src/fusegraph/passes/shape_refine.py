"""Shape refinement: re-run shape inference where rewrites made inputs more precise.

Folding turns values into constants of static shape, but the shapes recorded downstream were
inferred before, when those dims were still unknown or symbolic (onnx's ``unk__N``). This
pass re-infers every node whose inputs changed since its last visit and keeps a dim only when
it becomes more precise: an int replaces a symbol or an unknown, a symbol replaces an
unknown, a known rank replaces an unknown one. Nothing ever becomes less precise, so it converges.

Symbols are unified too: where the recorded dim is a symbol the frontend made up (onnx's
``unk__N``: not a dim of any graph input) and the rules derive a graph input's symbol for it
(a ``Gather`` of an embedding table by ``input_ids [batch, seq]`` is ``[batch, seq, D]``), the
made-up symbol is that input's dim wherever it appears, and is renamed throughout the graph,
so equalities it stood for are kept and the ones the rules proved are added (an exported
decoder's attention output is then provably ``[batch, heads, seq, D]``, which the fusion
rules read). A made-up symbol that the rules tie to two different input symbols keeps its
name.
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
        declared = {d for v in graph.inputs for d in (v.shape or ()) if isinstance(d, str)}
        names: dict[str, str | None] = {}         # made-up symbol -> the input symbol it is (None: two)
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
                _tie(names, declared, out.shape, shape)
                new_shape = _refine(out.shape, shape)
                new_dtype = DType(dtype) if out.dtype == DType.UNDEFINED and dtype else out.dtype
                if new_shape != out.shape or new_dtype != out.dtype:
                    out.shape, out.dtype = new_shape, new_dtype
                    refined += 1
        unified = _rename(graph, {k: v for k, v in names.items() if v is not None})
        stats = {**({"values_refined": refined} if refined else {}), **({"symbols_unified": unified} if unified else {})}
        return PassResult(refined + unified > 0, stats)


def _tie(names: dict, declared: set, recorded, inferred) -> None:
    """Note each made-up symbol of ``recorded`` whose dim the rules give as an input symbol."""
    if recorded is None or inferred is None or len(recorded) != len(inferred):
        return
    for o, n in zip(recorded, inferred):
        if isinstance(o, str) and isinstance(n, str) and o != n and o not in declared and n in declared:
            names[o] = n if names.get(o, n) == n else None


def _rename(graph: Graph, names: dict[str, str]) -> int:
    """Rename the symbols ``names`` maps in every value's shape; the values changed."""
    if not names:
        return 0
    changed = 0
    values = [v for n in graph.nodes for v in n.outputs] + list(graph.outputs)
    seen: set[int] = set()
    for v in values:
        if id(v) in seen or v.shape is None:
            continue
        seen.add(id(v))
        shape = tuple(names.get(d, d) if isinstance(d, str) else d for d in v.shape)
        if shape != v.shape:
            v.shape = shape
            changed += 1
    return changed
