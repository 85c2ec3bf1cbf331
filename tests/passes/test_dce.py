"""Dead code elimination: backwards from the outputs; impure ops, flagged values, graph
inputs and outputs stay."""
import numpy as np

import fusegraph as fg
from fusegraph.frontends.onnx import import_onnx
from fusegraph.ops import infer_graph
from fusegraph.passes.dce import DeadCodeElimination
from passes_util import F, check, const, model, node, ops

X = [("x", F, [2, 3])]


def _m():
    return model([node("Relu", ["x"], "r"), node("Exp", ["x"], "dead1"), node("Add", ["dead1", "c"], "dead2"),
                  node("Sigmoid", ["r"], "y")], X, ["y"], [const("c", 1.0), const("unused", [1.0, 2.0])])


def test_dead_nodes_and_constants_removed():
    compiled = check(_m(), level="O1")
    assert ops(compiled) == ["Relu", "Sigmoid"]
    assert not compiled.graph.constants
    assert [v.name for v in compiled.graph.inputs] == ["x"]


def test_impure_dead_node_kept():
    m = model([node("RandomUniformLike", ["x"], "noise"), node("Relu", ["x"], "y")], X, ["y"])
    compiled = fg.compile(m, fg.Config(level="O2", verify_each=True))
    assert ops(compiled) == ["RandomUniformLike", "Relu"]


def test_flagged_values_kept():
    g = import_onnx(_m())
    infer_graph(g)
    dead2 = next(n for n in g.nodes if n.op_type == "Add").outputs[0]
    dead2.flags.add("external")
    DeadCodeElimination().run(g)
    assert [n.op_type for n in g.nodes] == ["Relu", "Exp", "Add", "Sigmoid"]
    assert "unused" not in g.constants and "c" in g.constants
    compiled = fg.compile(g, fg.Config(level="O2", verify_each=True))
    # still computed, under its name (a fusion may absorb its producer, not the value)
    kept = [o for n in compiled.graph.nodes for o in n.outputs if o.name == dead2.name]
    assert kept and "external" in kept[0].flags
    np.testing.assert_allclose(compiled.run({"x": np.ones((2, 3), np.float32)})["y"],
                               1 / (1 + np.exp(-np.ones((2, 3)))), rtol=1e-6)


def test_unused_graph_input_stays_and_outputs_stay():
    m = model([node("Relu", ["x"], "y"), node("Neg", ["z"], "w")], X + [("z", F, [2])], ["y", "w"])
    compiled = check(m, level="O2")
    assert ops(compiled) == ["Relu", "Neg"] and [v.name for v in compiled.graph.inputs] == ["x", "z"]
