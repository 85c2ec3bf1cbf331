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


def test_never_trades_an_input_symbol_for_another_or_loses_precision():
    g = import_onnx(model([node("Relu", ["x"], "y"), node("Relu", ["z"], "w")],
                          [("x", F, ["N", 3]), ("z", F, ["M", 3])], ["y", "w"]))
    infer_graph(g)
    out = g.nodes[0].outputs[0]
    out.shape = ("M", 3)                  # another input's symbol: left as recorded
    ShapeRefine().run(g)
    assert out.shape == ("M", 3)
    out.shape = (None, 3)
    ShapeRefine().run(g)
    assert out.shape == ("N", 3)


def test_a_made_up_symbol_becomes_the_input_symbol_it_is_everywhere():
    """onnx's ``unk__1`` on a value the rules prove ``[N, 3]``: renamed to N in every value
    that carries it (the equalities it stood for are kept), a symbol tied to two input symbols
    is left alone."""
    g = import_onnx(model([node("Relu", ["x"], "y"), node("Neg", ["y"], "u"), node("Relu", ["z"], "w"),
                           node("Neg", ["w"], "v")],
                          [("x", F, ["N", 3]), ("z", F, ["M", 3])], ["u", "v"]))
    infer_graph(g)
    y, u, w, v = (n.outputs[0] for n in g.nodes)
    y.shape, u.shape = ("unk__1", 3), ("unk__1", 3)
    w.shape, v.shape = ("unk__2", 3), ("unk__2", 3)
    res = ShapeRefine().run(g)
    assert res.changed and res.stats.get("symbols_unified") == 4
    assert (y.shape, u.shape, w.shape, v.shape) == (("N", 3), ("N", 3), ("M", 3), ("M", 3))
    g2 = import_onnx(model([node("Relu", ["x"], "y"), node("Relu", ["z"], "w")],
                           [("x", F, ["N", 3]), ("z", F, ["M", 3])], ["y", "w"]))
    infer_graph(g2)
    a, b = (n.outputs[0] for n in g2.nodes)
    a.shape = b.shape = ("unk__7", 3)      # one made-up symbol, but N and M are not known equal
    ShapeRefine().run(g2)
    assert (a.shape, b.shape) == (("unk__7", 3), ("unk__7", 3))


def test_end_to_end_output_shape_is_static():
    compiled = check(_m(), level="O1")
    assert ops(compiled) == ["Reshape", "Relu", "Neg"]
    assert compiled.outputs[0].shape == (2, 3)
