"""If / Loop / Scan: the onnx docs' examples and bodies reading outer-scope values, each against
onnxruntime (ORT_DISABLE_ALL) and through the .fgm artifact; nested graphs in the IR (verify,
printer, serialisation, DCE) and the inlining of an If whose condition is a constant."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import VerifyError
from fusegraph.frontends.onnx import import_onnx
from fusegraph.ir.serialize import graph_from_dict, graph_to_dict
from fusegraph.ir.subgraphs import implicit_count
from fusegraph.ops import infer_graph
from fusegraph.passes.dce import DeadCodeElimination
from oracle import ort_run

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
OPSET = [helper.make_opsetid("", 17)]


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "main", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=OPSET)
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name + "_v"))


def _check(model, feeds, tmp_path, rtol=1e-4):
    """Matches onnxruntime, compiled and after save / load of the artifact."""
    want = ort_run(model, feeds)
    compiled = fg.compile(model)
    path = tmp_path / "m.fgm"
    compiled.save(path)
    for m in (compiled, fg.load(path)):
        got = m.run(feeds)
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=1e-6, err_msg=k)
    return compiled


def if_model():
    """The onnx docs' If, with branches that read outer values x and y."""
    then_g = helper.make_graph([helper.make_node("Add", ["x", "y"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [3])])
    else_g = helper.make_graph([_const("k", np.float32([5, 4, 3])), helper.make_node("Mul", ["y", "k"], ["e"])],
                               "else", [], [helper.make_tensor_value_info("e", F, [3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             _const("zero", np.float32(0)),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["res"], then_branch=then_g, else_branch=else_g)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("y", F, [3])],
                  [helper.make_tensor_value_info("res", F, [3])])


def loop_model():
    """The onnx docs' Loop (loop11): y accumulates slices of x; scan output per iteration."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         _const("x", np.float32([1, 2, 3, 4, 5])),
         _const("one", np.int64([1])),
         helper.make_node("Unsqueeze", ["iter_count", "axes"], ["i"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Slice", ["x", "i", "end"], ["slice_out"]),
         helper.make_node("Add", ["y_in", "slice_out"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan_out"])],
        "loop_body",
        [helper.make_tensor_value_info("iter_count", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("y_in", F, [1])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("y_out", F, [1]),
         helper.make_tensor_value_info("scan_out", F, [1])])
    nodes = [_const("axes", np.int64([0])),
             helper.make_node("Loop", ["trip_count", "cond", "y"], ["res_y", "res_scan"], body=body)]
    return _model(nodes, [helper.make_tensor_value_info("trip_count", I64, []),
                          helper.make_tensor_value_info("cond", B, []), helper.make_tensor_value_info("y", F, [1])],
                  [helper.make_tensor_value_info("res_y", F, [1]),
                   helper.make_tensor_value_info("res_scan", F, [None, 1])])


def scan_model():
    """The onnx docs' Scan: a running sum over the rows of x."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
         helper.make_node("Identity", ["sum_out"], ["scan_out"])], "scan_body",
        [helper.make_tensor_value_info("sum_in", F, [2]), helper.make_tensor_value_info("next", F, [2])],
        [helper.make_tensor_value_info("sum_out", F, [2]), helper.make_tensor_value_info("scan_out", F, [2])])
    nodes = [helper.make_node("Scan", ["initial", "x"], ["y", "z"], num_scan_inputs=1, body=body)]
    return _model(nodes, [helper.make_tensor_value_info("initial", F, [2]),
                          helper.make_tensor_value_info("x", F, [3, 2])],
                  [helper.make_tensor_value_info("y", F, [2]), helper.make_tensor_value_info("z", F, [3, 2])])


def while_model():
    """A data-dependent loop (no trip count): doubles v until its sum passes the outer limit;
    an If nested in the body reads an outer value two levels up (captured through both)."""
    inner_then = helper.make_graph([helper.make_node("Mul", ["v_in", "scale"], ["a"])], "t", [],
                                   [helper.make_tensor_value_info("a", F, None)])
    inner_else = helper.make_graph([helper.make_node("Add", ["v_in", "scale"], ["b"])], "e", [],
                                   [helper.make_tensor_value_info("b", F, None)])
    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["v_in"], ["s0"], keepdims=0),
         helper.make_node("Less", ["s0", "limit"], ["small"]),
         helper.make_node("If", ["small"], ["v_out"], then_branch=inner_then, else_branch=inner_else),
         helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["go"])],
        "while_body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("v_in", F, [4])],
        [helper.make_tensor_value_info("go", B, []), helper.make_tensor_value_info("v_out", F, [4])])
    nodes = [_const("t", True), helper.make_node("Loop", ["", "t", "v"], ["v_final"], body=body)]
    return _model(nodes, [helper.make_tensor_value_info("v", F, [4]), helper.make_tensor_value_info("limit", F, []),
                          helper.make_tensor_value_info("scale", F, [])],
                  [helper.make_tensor_value_info("v_final", F, [4])])


def test_if_docs_example(tmp_path):
    m = if_model()
    x, y = np.float32([1, 2, 3]), np.float32([0.5, -1, 2])
    _check(m, {"x": x, "y": y}, tmp_path)
    _check(m, {"x": -x, "y": y}, tmp_path)


@pytest.mark.parametrize("trip,cond", [(5, True), (3, True), (0, True), (4, False)])
def test_loop_docs_example(tmp_path, trip, cond):
    if trip == 0:   # zero iterations: the scan output is empty with the body's static shape
        got = fg.compile(loop_model()).run({"trip_count": np.array(0), "cond": np.array(True), "y": np.float32([-2])})
        assert got["res_scan"].shape == (0, 1) and got["res_y"].tolist() == [-2]
        return
    _check(loop_model(), {"trip_count": np.array(trip), "cond": np.array(cond), "y": np.float32([-2])}, tmp_path)


def test_scan_docs_example(tmp_path):
    _check(scan_model(), {"initial": np.float32([0, 0]), "x": np.float32([[1, 2], [3, 4], [5, 6]])}, tmp_path)


def test_while_loop_with_nested_capture(tmp_path):
    m = while_model()
    for limit in (20.0, 100.0, 0.5):
        _check(m, {"v": np.float32([1, 2, 0.5, 1]), "limit": np.array(limit, np.float32),
                   "scale": np.array(2.0, np.float32)}, tmp_path)


# ----- the IR ----------------------------------------------------------------------------------
def test_import_makes_bodies_with_captures():
    g = import_onnx(while_model())
    infer_graph(g)
    g.verify()
    loop = next(n for n in g.nodes if n.op_type == "Loop")
    body = loop.attrs["body"]
    assert [c.name for c in body.captures] == ["limit", "scale"]
    assert implicit_count(loop) == 2 and [v.name for v in loop.inputs[3:]] == ["limit", "scale"]
    inner = next(n for n in body.nodes if n.op_type == "If")
    assert {c.name for c in inner.attrs["then_branch"].captures} == {"v_in", "scale"}
    assert [n.name for n in g.inputs[2].users] == [loop.name]   # the outer read is a use
    text = str(g)
    assert "body: graph while_body" in text and "outer  %scale" in text and "then_branch: graph t" in text


def test_serialize_round_trip_keeps_bodies():
    g = import_onnx(while_model())
    infer_graph(g)
    data, tensors = graph_to_dict(g)
    back = graph_from_dict(data, tensors)
    back.verify()
    assert str(back) == str(g)
    body = next(n for n in back.nodes if n.op_type == "Loop").attrs["body"]
    assert [c.name for c in body.captures] == ["limit", "scale"]


def test_verify_refuses_mismatched_captures():
    g = import_onnx(if_model())
    node = next(n for n in g.nodes if n.op_type == "If")
    node.attrs["else_branch"].captures.pop()
    with pytest.raises(VerifyError, match="disagree on their captures"):
        g.verify()


def test_dce_keeps_values_only_a_body_reads():
    g = import_onnx(if_model())
    infer_graph(g)
    DeadCodeElimination().run(g)
    g.verify()
    assert {n.op_type for n in g.nodes} == {"ReduceSum", "Greater", "If"}
    assert len(next(n for n in g.nodes if n.op_type == "If").inputs) == 3   # cond, x, y


def test_constant_condition_if_is_inlined(tmp_path):
    m = if_model()
    m.graph.node[2].CopyFrom(_const("cond", True))   # the condition becomes a constant
    compiled = _check(m, {"x": np.float32([1, 2, 3]), "y": np.float32([4, 5, 6])}, tmp_path)
    assert "If" not in compiled.graph.op_histogram()


def test_control_flow_refuses_without_runtime():
    from fusegraph.errors import UnsupportedOpError
    from fusegraph.ops import opdef_for
    from fusegraph.ops.registry import NodeContext
    g = import_onnx(scan_model())
    node = g.nodes[0]
    with pytest.raises(UnsupportedOpError, match="only inside the runtime"):
        opdef_for(node).build(NodeContext(node))


def _body_pass_model():
    """A Loop body with a constant subexpression (2 * 3), a duplicate (Add twice) and dead code
    that alone reads the outer value w (itself made by a node nothing else reads)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         _const("a", np.float32(2)), _const("b", np.float32(3)),
         helper.make_node("Mul", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["y_in", "ab"], ["s1"]),
         helper.make_node("Add", ["y_in", "ab"], ["s2"]),
         helper.make_node("Mul", ["s1", "s2"], ["y_out"]),
         helper.make_node("Neg", ["w"], ["dead"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
                 helper.make_tensor_value_info("y_in", F, [2])],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("y_out", F, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["w"]),
             helper.make_node("Loop", ["n", "", "y"], ["y_final"], body=body)]
    return _model(nodes, [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("x", F, [2]),
                          helper.make_tensor_value_info("y", F, [2])],
                  [helper.make_tensor_value_info("y_final", F, [2])])


def test_fold_cse_and_dce_run_inside_bodies(tmp_path):
    from fusegraph.passes.cse import CommonSubexpressionElimination
    from fusegraph.passes.fold import ConstantFold
    from fusegraph.passes.manager import PassOptions
    g = import_onnx(_body_pass_model())
    infer_graph(g)
    loop = next(n for n in g.nodes if n.op_type == "Loop")
    assert [c.name for c in loop.attrs["body"].captures] == ["w"]
    for p in (ConstantFold(PassOptions()), CommonSubexpressionElimination(), DeadCodeElimination()):
        assert p.run(g).changed, p.name
        g.verify()
    body = loop.attrs["body"]
    assert body.op_histogram() == {"Add": 1, "Identity": 1, "Mul": 1}   # 2*3 folded, Add merged, Neg gone
    assert body.captures == [] and implicit_count(loop) == 0 and len(loop.inputs) == 3
    assert [n.op_type for n in g.nodes] == ["Loop"]                   # Relu only fed the dead code
    _check(_body_pass_model(), {"n": np.array(3), "x": np.float32([1, -1]), "y": np.float32([0.5, -0.25])},
           tmp_path)


def test_malformed_stored_bodies_are_refused():
    from fusegraph.errors import ArtifactError
    g = import_onnx(if_model())
    infer_graph(g)
    data, tensors = graph_to_dict(g)
    node = next(e for e in data["nodes"] if e["op_type"] == "If")
    bad_body = dict(node["attrs"]["then_branch"]["$graph"], graph=["not", "a", "graph"])
    node["attrs"]["then_branch"] = {"$graph": bad_body}
    with pytest.raises(ArtifactError, match="must be dict"):
        graph_from_dict(data, tensors)
    nested: dict = {"schema": 1}
    for _ in range(40):   # a body inside a body inside ...: bounded, never a recursion error
        nested = {"schema": 1, "name": "b", "opset": {"": 17}, "values": [], "inputs": [], "constants": [],
                  "outputs": [], "nodes": [{"name": "n", "op_type": "If", "version": 17, "inputs": [],
                                            "outputs": [], "attrs": {"g": {"$graph": {"prefix": "p/",
                                                                                      "graph": nested}}}}]}
    with pytest.raises(ArtifactError, match="nested too deeply"):
        graph_from_dict(nested, {})
