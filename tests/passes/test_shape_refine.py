"""Shape refinement: shapes recorded before folding become static once their inputs are."""
import numpy as np

from fusegraph.frontends.onnx import import_onnx
from fusegraph.ops import infer_graph
from fusegraph.passes.shape_refine import ShapeRefine
from passes_util import F, check, const, model, node, ops


def _m():
    return model([node("Add", ["s1", "s2"], "shape"), node("Reshape", ["x", "shape"], "r"),
                  node("Relu", ["r"], "t"), node("Neg", ["t"], "y")], [("x", F, [6])], ["y"],
                 [const("s1", [2, 3], np.int64), const("s2", [0, 0], np.int64)])


def test_refines_stale_shapes_after_folding():
    g = import_onnx(_m())
    infer_graph(g)
    for n in g.nodes[1:]:  # as if nothing were known downstream of the shape computation
        n.outputs[0].shape = ("unk__1", None) if n.op_type != "Neg" else None
    from fusegraph.passes.fold import ConstantFold
    from fusegraph.passes.manager import PassOptions
    assert ConstantFold(PassOptions()).run(g).changed
    refine = ShapeRefine()
    assert refine.run(g).changed
    assert [n.outputs[0].shape for n in g.nodes] == [(2, 3)] * 3
    assert not refine.run(g).changed  # converged; unchanged nodes are not re-inferred


def test_never_trades_a_symbol_for_another_or_loses_precision():
    g = import_onnx(model([node("Relu", ["x"], "y")], [("x", F, ["N", 3])], ["y"]))
    infer_graph(g)
    out = g.nodes[0].outputs[0]
    out.shape = ("batch", 3)
    ShapeRefine().run(g)
    assert out.shape == ("batch", 3)
    out.shape = (None, 3)
    ShapeRefine().run(g)
    assert out.shape == ("N", 3)


def test_end_to_end_output_shape_is_static():
    compiled = check(_m(), level="O1")
    assert ops(compiled) == ["Reshape", "Relu", "Neg"]
    assert compiled.outputs[0].shape == (2, 3)
