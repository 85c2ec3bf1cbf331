"""Shape arithmetic on Python values (``ops/shape_ints.py``) against ``onnx.reference``: each
op's function on ``SmallInts`` gives the reference's values, shape and type, or None where its
operands' form is not handled there (the caller then runs the op's kernel), and raises where
the kernel would (an index out of range)."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

from fusegraph.frontends.onnx import import_onnx as import_model
from fusegraph.ops.shape_ints import MAX_ELEMENTS, SmallInts, small_kernel

_TP = {np.int64: TP.INT64, np.int32: TP.INT32, np.bool_: TP.BOOL}


def _model(op: str, arrays: list, attrs: dict, opset: int = 17, outputs: int = 1, out_type=None):
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    inputs = [helper.make_tensor_value_info(n, _TP[a.dtype.type], a.shape)
              for n, a in zip(names, arrays) if a is not None]
    outs = [helper.make_tensor_value_info(f"y{i}", out_type or TP.UNDEFINED, None) for i in range(outputs)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], **attrs)
    return helper.make_model(helper.make_graph([node], "one", inputs, outs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _run(op: str, arrays: list, attrs: dict | None = None, opset: int = 17, out_type=None):
    """(the reference's outputs, the small function's outputs) for one node."""
    attrs = attrs or {}
    model = _model(op, arrays, attrs, opset, out_type=out_type)
    feeds = {f"x{i}": a for i, a in enumerate(arrays) if a is not None}
    expected = ReferenceEvaluator(model).run(None, feeds)
    graph = import_model(onnx.shape_inference.infer_shapes(model))
    node = graph.nodes[0]
    kernel = small_kernel(node)
    assert kernel is not None, op
    if op in ("Shape", "Size"):
        got = kernel(tuple(arrays[0].shape))
    else:
        got = kernel(*[None if a is None else SmallInts.of(torch.from_numpy(np.array(a))) for a in arrays])
    return expected, got


def _same(expected: list, got) -> None:
    assert got is not None
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == tuple(e.shape)
        assert g.dtype == torch.from_numpy(np.array(e)).dtype
        assert list(g.data) == np.asarray(e).reshape(-1).tolist()
        np.testing.assert_array_equal(g.tensor().numpy(), e)


def i64(*v):
    return np.array(v, np.int64)


CASES = [
    ("Gather", [i64(1, 12, 7, 64), np.array(2, np.int64)], {"axis": 0}),
    ("Gather", [i64(1, 12, 7, 64), np.array(-1, np.int64)], {"axis": 0}),
    ("Gather", [i64(1, 12, 7, 64), i64(0, -2, 3)], {"axis": 0}),
    ("Gather", [i64(5, 6, 7), np.array([[0, 1], [2, -3]], np.int64)], {"axis": -1}),
    ("Gather", [i64(5, 6, 7), np.array([1], np.int32)], {}),
    ("Unsqueeze", [np.array(9, np.int64), i64(0)], {}),
    ("Unsqueeze", [i64(3, 4), i64(-1, 0)], {}),
    ("Unsqueeze", [np.array([[3, 4]], np.int64), i64(1, -1)], {}),
    ("Squeeze", [np.array([[3], [4]], np.int64), i64(1)], {}),
    ("Squeeze", [np.array([[[7]]], np.int64), None], {}),
    ("Squeeze", [np.array([[[7]]], np.int64), i64(-1, 0)], {}),
    ("Concat", [i64(1), i64(-1, 12), i64(64)], {"axis": 0}),
    ("Concat", [i64(1, 2), np.zeros(0, np.int64)], {"axis": -1}),
    ("Shape", [np.zeros((1, 12, 3, 8), np.int64)], {}),
    ("Shape", [np.zeros((1, 12, 3, 8), np.int64)], {"start": 1, "end": -1}),
    ("Shape", [np.zeros((1, 12, 3, 8), np.int64)], {"start": -2}),
    ("Shape", [np.zeros((1, 12, 3, 8), np.int64)], {"start": -9, "end": 99}),
    ("Size", [np.zeros((2, 3, 0), np.int64)], {}),
    ("Size", [np.zeros((2, 3, 5), np.int64)], {}),
    ("Slice", [i64(1, 12, 7, 64), i64(1), i64(3)], {}),
    ("Slice", [i64(1, 12, 7, 64), i64(-2), i64(np.iinfo(np.int64).max), i64(0), i64(1)], {}),
    ("Slice", [i64(1, 12, 7, 64, 5), i64(-99), i64(4), i64(-1), i64(2)], {}),
    ("Slice", [i64(1, 12, 7, 64), i64(3), i64(1)], {}),
    ("Range", [np.array(0, np.int64), np.array(7, np.int64), np.array(1, np.int64)], {}),
    ("Range", [np.array(5, np.int64), np.array(-4, np.int64), np.array(-2, np.int64)], {}),
    ("Range", [np.array(5, np.int64), np.array(5, np.int64), np.array(3, np.int64)], {}),
    ("Range", [np.array(3, np.int32), np.array(10, np.int32), np.array(3, np.int32)], {}),
    ("Add", [i64(1, 2, 3), np.array(7, np.int64)], {}),
    ("Add", [np.array([[5]], np.int64), i64(1, 2, 3)], {}),
    ("Sub", [np.array(7, np.int32), np.array([2, 9], np.int32)], {}),
    ("Mul", [i64(3, -4), i64(5, 6)], {}),
    ("Equal", [i64(1, -1, 64), np.array(-1, np.int64)], {}),
    ("Less", [i64(1, -1, 64), i64(0, 0, 64)], {}),
    ("Greater", [i64(1, -1, 64), np.array(0, np.int64)], {}),
    ("LessOrEqual", [np.array(3, np.int64), i64(1, 3, 5)], {}),
    ("GreaterOrEqual", [i64(1, 3, 5), i64(3)], {}),
    ("Max", [i64(1, 3, 5), np.array(2, np.int64)], {}),
    ("Min", [i64(1, 3, 5), i64(4, 2, 0)], {}),
    ("Where", [np.array([True, False, True]), i64(1, 2, 3), np.array(-5, np.int64)], {}),
    ("Where", [np.array(False), i64(1, 2, 3), i64(4, 5, 6)], {}),
]


@pytest.mark.parametrize("op,arrays,attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_an_op_on_python_values_gives_the_reference_values(op, arrays, attrs):
    expected, got = _run(op, arrays, attrs)
    _same(expected, got)


@pytest.mark.parametrize("to,source", [(TP.INT32, i64(3, -4, 5)), (TP.BOOL, i64(0, 2, -1)),
                                       (TP.INT64, np.array([True, False])), (TP.UINT8, i64(0, 255))])
def test_a_cast_between_integer_types_gives_the_reference_values(to, source):
    model = _model("Cast", [source], {"to": to}, out_type=to)
    expected = ReferenceEvaluator(model).run(None, {"x0": source})
    node = import_model(onnx.shape_inference.infer_shapes(model)).nodes[0]
    _same(expected, small_kernel(node)(SmallInts.of(torch.from_numpy(source))))


@pytest.mark.parametrize("op,arrays,attrs", [
    ("Gather", [np.arange(6, dtype=np.int64).reshape(2, 3), np.array(1, np.int64)], {"axis": 0}),   # 2-D data
    ("Add", [np.ones((2, 1), np.int64), np.ones((1, 3), np.int64)], {}),       # a broadcast of both
    ("Add", [i64(np.iinfo(np.int64).max), i64(1)], {}),                        # wraps in int64
    ("Mul", [np.array([1 << 20], np.int32), np.array([1 << 12], np.int32)], {}),   # wraps in int32
    ("Range", [np.array(0, np.int64), np.array(MAX_ELEMENTS + 1, np.int64), np.array(1, np.int64)], {}),
    ("Concat", [np.arange(40, dtype=np.int64), np.arange(40, dtype=np.int64)], {"axis": 0}),
    ("Slice", [i64(1, 2, 3, 4), i64(-1), i64(-5), i64(0), i64(-1)], {}),      # reversed
    ("Unsqueeze", [i64(3, 4), i64(0, -3)], {}),                                  # one axis twice
])
def test_a_form_not_handled_on_python_values_is_left_to_the_kernel(op, arrays, attrs):
    model = _model(op, arrays, attrs)
    node = import_model(onnx.shape_inference.infer_shapes(model)).nodes[0]
    args = [SmallInts.of(torch.from_numpy(np.array(a))) for a in arrays]
    if any(a is None for a in args):                    # too many values to be small at all
        assert SmallInts.of(torch.from_numpy(np.arange(MAX_ELEMENTS + 1))) is None
        return
    assert small_kernel(node)(*args) is None


def test_an_index_out_of_range_raises_as_the_kernel_does():
    model = _model("Gather", [i64(1, 2, 3), np.array(3, np.int64)], {"axis": 0})
    node = import_model(onnx.shape_inference.infer_shapes(model)).nodes[0]
    with pytest.raises(IndexError):
        small_kernel(node)(SmallInts.of(torch.from_numpy(i64(1, 2, 3))), SmallInts.of(torch.tensor(3)))
    with pytest.raises(IndexError):
        small_kernel(node)(SmallInts.of(torch.from_numpy(i64(1, 2, 3))), SmallInts.of(torch.tensor(-4)))


def test_only_small_integer_tensors_are_held_as_python_values():
    assert SmallInts.of(torch.zeros(3)) is None                       # float
    assert SmallInts.of(torch.zeros(MAX_ELEMENTS + 1, dtype=torch.int64)) is None
    got = SmallInts.of(torch.tensor([[1, 2]], dtype=torch.int32))
    assert (got.shape, got.data, got.dtype) == ((1, 2), (1, 2), torch.int32)


def test_max_of_three_is_left_to_the_kernel():
    arrays = [i64(1, 5), i64(4, 2), i64(3, 3)]
    model = _model("Max", arrays, {})
    node = import_model(onnx.shape_inference.infer_shapes(model)).nodes[0]
    assert small_kernel(node)(*[SmallInts.of(torch.from_numpy(a)) for a in arrays]) is None
