"""Shape tensors read symbolically (``ops/shape_values.py``) and what shape inference makes of
them, on the forms exporters write: a reshape target ``Concat(Unsqueeze(Gather(Shape(x), i)),
[k])``, the expand target ``Where(Equal(t, ones * -1), ones, t)``, position ids
``Range(0, Gather(Shape(x), 1), 1)``. Each inferred shape is checked against the shape the
op's own kernel gives at concrete sizes of the symbols (the independent side)."""
from __future__ import annotations

import pytest
import torch

from fusegraph.ir import DType, Graph
from fusegraph.ops import infer_node, opdef_for
from fusegraph.ops.registry import NodeContext
from fusegraph.ops.shape_values import expand_target, shape_scalar, shape_vector

I64 = DType.INT64


def _i64(g: Graph, name: str, values) -> object:
    return g.add_constant(name, torch.tensor(values, dtype=torch.int64))


def _out(node, dtype, shape):
    node.outputs[0].dtype, node.outputs[0].shape = dtype, shape
    return node.outputs[0]


def _dim(g: Graph, x, i: int, name: str):
    """``Unsqueeze(Gather(Shape(x), i))``: one entry of a target vector, and the scalar."""
    shape = _out(g.add_node("Shape", [x], name=f"{name}_shape"), I64, (len(x.shape),))
    scalar = _out(g.add_node("Gather", [shape, _i64(g, f"{name}_i", i)], attrs={"axis": 0}, name=f"{name}_g"), I64, ())
    vec = _out(g.add_node("Unsqueeze", [scalar, _i64(g, f"{name}_ax", [0])], name=f"{name}_u", version=13), I64, (1,))
    return vec, scalar


def _graph():
    g = Graph("shapes")
    x = g.add_input("x", DType.FLOAT, ("batch", "seq", 64))
    b, b_scalar = _dim(g, x, 0, "b")
    s, s_scalar = _dim(g, x, 1, "s")
    return g, x, b, s, b_scalar, s_scalar


def _run_shape(node, feeds: dict) -> tuple:
    """The output shape the op's own kernel gives on ``feeds`` (value name -> tensor)."""
    kernel = opdef_for(node).build(NodeContext(node, "cpu"))
    args = [None if v is None else (v.const if v.is_const else feeds[v.name]) for v in node.inputs]
    got = kernel(*args)
    return tuple((got[0] if isinstance(got, (tuple, list)) else got).shape)


def test_a_reshape_target_built_from_shapes_is_read_and_inferred():
    g, x, b, s, _, _ = _graph()
    target = _out(g.add_node("Concat", [b, s, _i64(g, "heads", [4]), _i64(g, "d", [16])], attrs={"axis": 0},
                             name="target"), I64, (4,))
    assert shape_vector(target) == ["batch", "seq", 4, 16]
    r = g.add_node("Reshape", [x, target], name="r", version=14)
    (dtype, shape), = infer_node(r)
    assert shape == ("batch", "seq", 4, 16)
    xt = torch.zeros(3, 5, 64)
    assert _run_shape(r, {"x": xt, "target": torch.tensor([3, 5, 4, 16])}) == (3, 5, 4, 16)


def test_an_unreadable_entry_is_unknown_and_a_reshape_to_it_is_not_guessed():
    g, x, b, s, b_scalar, s_scalar = _graph()
    total = _out(g.add_node("Add", [b_scalar, s_scalar], name="sum"), I64, ())
    t = _out(g.add_node("Unsqueeze", [total, _i64(g, "ax", [0])], name="t_u", version=13), I64, (1,))
    target = _out(g.add_node("Concat", [b, t], attrs={"axis": 0}, name="target"), I64, (2,))
    assert shape_vector(target) == ["batch", None]
    (dtype, shape), = infer_node(g.add_node("Reshape", [x, target], name="r", version=14))
    assert shape == (None, None)          # an unknown entry may be 0 or -1: nothing is assumed


@pytest.mark.parametrize("minus_one_first", [False, True])
def test_the_exporters_expand_target_keeps_its_dims_and_makes_minus_one_one(minus_one_first):
    g, x, b, s, _, _ = _graph()
    t = _out(g.add_node("Concat", [b, _i64(g, "m1", [-1]), s], attrs={"axis": 0}, name="t"), I64, (3,))
    ones = g.add_constant("ones", torch.ones(3, dtype=torch.int64))
    minus = _out(g.add_node("Mul", [ones, _i64(g, "neg", -1)], name="minus"), I64, (3,))
    eq = _out(g.add_node("Equal", [minus, t] if minus_one_first else [t, minus], name="eq"), DType.BOOL, (3,))
    where = _out(g.add_node("Where", [eq, ones, t], name="where"), I64, (3,))
    assert expand_target(where) == ["batch", 1, "seq"]
    mask = g.add_input("mask", DType.BOOL, (1, 1, "seq"))
    e = g.add_node("Expand", [mask, where], name="e", version=13)
    (dtype, shape), = infer_node(e)
    assert shape == ("batch", 1, "seq")
    got = _run_shape(e, {"mask": torch.ones(1, 1, 5, dtype=torch.bool), "where": torch.tensor([3, 1, 5])})
    assert got == (3, 1, 5)


def test_an_equal_against_anything_but_minus_one_is_not_read_through():
    g, x, b, s, _, _ = _graph()
    t = _out(g.add_node("Concat", [b, s], attrs={"axis": 0}, name="t"), I64, (2,))
    other = g.add_input("other", I64, (2,))
    eq = _out(g.add_node("Equal", [t, other], name="eq"), DType.BOOL, (2,))
    where = _out(g.add_node("Where", [eq, g.add_constant("ones", torch.ones(2, dtype=torch.int64)), t],
                            name="where"), I64, (2,))
    assert expand_target(where) is None


def test_position_ids_are_as_long_as_the_dim_they_count():
    g, x, b, s, _, s_scalar = _graph()
    cast = _out(g.add_node("Cast", [s_scalar], attrs={"to": int(I64)}, name="cast"), I64, ())
    assert shape_scalar(cast) == "seq"
    r = g.add_node("Range", [_i64(g, "zero", 0), cast, _i64(g, "one", 1)], name="range")
    (dtype, shape), = infer_node(r)
    assert shape == ("seq",)
    assert _run_shape(r, {"cast": torch.tensor(7)}) == (7,)
    r2 = g.add_node("Range", [_i64(g, "two", 2), cast, _i64(g, "one2", 1)], name="range2")
    assert infer_node(r2)[0][1] == (None,)           # not from 0: its length is not the dim
