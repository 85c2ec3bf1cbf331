"""Bad feeds give InputError naming the input, what was expected and what was given."""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import fusegraph as fg
from fusegraph.errors import InputError


@pytest.fixture(scope="module")
def model():
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"])], "two_inputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    return fg.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _x(*shape, dtype=np.float32):
    return np.ones(shape, dtype=dtype)


def test_good_feeds_run_and_torch_tensors_are_accepted(model):
    out = model.run({"x": _x(2, 3), "y": torch.ones(2, 3)})
    np.testing.assert_array_equal(out["z"], np.full((2, 3), 2, np.float32))


@pytest.mark.parametrize("feeds, words", [
    ({"x": _x(2, 3), "y": _x(2, 3), "w": _x(1)}, ["unknown input", "'w'", "['x', 'y']"]),
    ({"x": _x(2, 3)}, ["missing input", "'y'", "y: f32[batch,3]"]),
    ({"x": _x(3), "y": _x(2, 3)}, ["'x'", "rank 2", "got rank 1"]),
    ({"x": _x(2, 4), "y": _x(2, 3)}, ["'x'", "[batch,3]", "[2,4]", "dim 1 must be 3"]),
    ({"x": _x(2, 3, dtype=np.float64), "y": _x(2, 3)}, ["'x'", "FLOAT", "DOUBLE"]),
    ({"x": _x(2, 3), "y": _x(5, 3)}, ["'y'", "'batch'", "set 'batch' = 2"]),
    ({"x": "hello", "y": _x(2, 3)}, ["'x'", "numpy array"]),
])
def test_bad_feeds(model, feeds, words):
    with pytest.raises(InputError) as info:
        model.run(feeds)
    for w in words:
        assert w in str(info.value)


def test_non_dict_feeds(model):
    with pytest.raises(InputError, match="dict"):
        model.run([_x(2, 3), _x(2, 3)])


def test_outputs_do_not_alias_inputs():
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = fg.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.zeros(2, np.float32)
    y = m.run({"x": x})["y"]
    y[0] = 5
    assert x[0] == 0
