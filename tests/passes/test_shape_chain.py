"""Shape-chain folding: Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains fold when the
dims they read are static; dims of the reshaped tensor itself become 0 ("copy") entries."""
import numpy as np

from passes_util import F, check, const, feeds_for, model, node, ops


def _head_split(x_shape):
    """Reshape x[b, s, 12] to [b, s, 3, 4] through the exporter's Shape/Gather/Concat chain."""
    nodes = [node("Relu", ["x"], "r"), node("Shape", ["r"], "shp"),
             node("Gather", ["shp", "i0"], "d0", axis=0), node("Gather", ["shp", "i1"], "d1", axis=0),
             node("Unsqueeze", ["d0", "ax"], "u0"), node("Unsqueeze", ["d1", "ax"], "u1"),
             node("Concat", ["u0", "u1", "tail"], "target", axis=0), node("Reshape", ["r", "target"], "t"),
             node("Sigmoid", ["t"], "y")]
    inits = [const("i0", 0, np.int64), const("i1", 1, np.int64), const("ax", [0], np.int64),
             const("tail", [3, 4], np.int64)]
    return model(nodes, [("x", F, x_shape)], ["y"], inits)


def test_static_chain_folds_to_constant_reshape():
    compiled = check(_head_split([2, 5, 12]), level="O1")
    assert ops(compiled) == ["Relu", "Reshape", "Sigmoid"]
    assert compiled.graph.nodes[1].inputs[1].const.tolist() == [2, 5, 3, 4]


def test_symbolic_dims_become_copy_entries():
    m = _head_split(["batch", "seq", 12])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Reshape", "Sigmoid"]
    assert compiled.graph.nodes[1].inputs[1].const.tolist() == [0, 0, 3, 4]
    for dims in ({"batch": 1, "seq": 7}, {"batch": 3, "seq": 2}):
        check(m, level="O1", feeds=feeds_for(m, 1, dims))


def test_gather_of_static_dim_in_symbolic_shape():
    nodes = [node("Shape", ["x"], "shp"), node("Gather", ["shp", "i"], "d", axis=0),
             node("Unsqueeze", ["d", "ax"], "u"), node("Concat", ["m1", "u"], "target", axis=0),
             node("Reshape", ["x", "target"], "y")]
    m = model(nodes, [("x", F, ["N", 3, 4])], ["y"],
              [const("i", -1, np.int64), const("ax", [0], np.int64), const("m1", [-1], np.int64)])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Reshape"] and compiled.graph.nodes[0].inputs[1].const.tolist() == [-1, 4]


def test_slice_of_shape_and_size():
    nodes = [node("Shape", ["x"], "shp"), node("Slice", ["shp", "st", "en"], "hw"),
             node("ReduceProd", ["hw"], "p", keepdims=1), node("Concat", ["m1", "p"], "target", axis=0),
             node("Reshape", ["x", "target"], "r"), node("Size", ["x"], "n"), node("Cast", ["n"], "nf", to=F),
             node("Div", ["r", "nf"], "y")]
    m = model(nodes, [("x", F, ["N", 3, 4])], ["y"],
              [const("st", [1], np.int64), const("en", [3], np.int64), const("m1", [-1], np.int64)])
    compiled = check(m, level="O1", feeds=feeds_for(m, dims={"N": 2}))
    assert "Slice" not in ops(compiled) and "Shape" not in ops(compiled)
    static = model(nodes, [("x", F, [2, 3, 4])], ["y"],
                   [const("st", [1], np.int64), const("en", [3], np.int64), const("m1", [-1], np.int64)])
    assert ops(check(static, level="O1")) == ["Reshape", "Mul"]


def test_shape_with_start_end_attributes():
    nodes = [node("Shape", ["x"], "shp", start=1, end=-1), node("Cast", ["shp"], "f", to=F),
             node("Add", ["x", "f"], "y")]
    m = model(nodes, [("x", F, ["N", 3, 3])], ["y"])
    assert ops(check(m, level="O1", feeds=feeds_for(m, dims={"N": 2}))) == ["Add"]


def test_dim_from_another_tensor_with_unprovable_equality_declined():
    nodes = [node("Shape", ["z"], "shp"), node("Gather", ["shp", "i0"], "d0", axis=0),
             node("Unsqueeze", ["d0", "ax"], "u0"), node("Concat", ["u0", "tail"], "target", axis=0),
             node("Reshape", ["x", "target"], "y")]
    m = model(nodes, [("x", F, ["A", 6]), ("z", F, ["B", 2])], ["y"],
              [const("i0", 0, np.int64), const("ax", [0], np.int64), const("tail", [6], np.int64)])
    feeds = {"x": np.ones((3, 6), np.float32), "z": np.ones((3, 2), np.float32)}
    assert "Shape" in ops(check(m, level="O1", feeds=feeds))
