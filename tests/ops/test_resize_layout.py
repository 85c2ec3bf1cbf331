"""Resize's kernel on channels-last data whose size-1 batch carries an arbitrary stride (as a
reshape of a transposed token tensor gives it, segformer's decode head): the result is the
ONNX reference's (``onnx.reference``), and it stays channels-last, so torch's channels-last
interpolation ran rather than its generic strided one."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from fusegraph.ir import DType, Graph
from fusegraph.ops import opdef_for
from fusegraph.ops._tensor_util import settled_strides
from fusegraph.ops.registry import NodeContext


def _resize_node(c: int, h: int, out: int, mode: str, coord: str):
    g = Graph("resize")
    x = g.add_input("x", DType.FLOAT, (1, c, h, h))
    roi = g.add_constant("roi", torch.zeros(0))
    scales = g.add_constant("scales", torch.zeros(0))
    sizes = g.add_constant("sizes", torch.tensor([1, c, out, out], dtype=torch.int64))
    node = g.add_node("Resize", [x, roi, scales, sizes], outputs=1,
                      attrs={"mode": mode, "coordinate_transformation_mode": coord}, version=13)
    node.outputs[0].dtype = DType.FLOAT
    return node


def _reference(x: np.ndarray, out: int, mode: str, coord: str) -> np.ndarray:
    c = x.shape[1]
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                          coordinate_transformation_mode=coord)], "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, out, out])],
        [helper.make_tensor("sizes", TensorProto.INT64, [4], [1, c, out, out])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("mode,coord", [("linear", "half_pixel"), ("linear", "align_corners"),
                                        ("cubic", "half_pixel")])
def test_resize_of_channels_last_tokens_matches_the_reference_and_stays_channels_last(mode, coord):
    c, h, out = 24, 8, 16
    tokens = torch.from_numpy(np.random.default_rng(0).standard_normal((1, h * h, c)).astype(np.float32))
    x = tokens.transpose(1, 2).reshape(1, c, h, h)          # channels-last data, a batch stride of c
    assert x.stride(0) != x.numel() and x.stride(1) == 1
    node = _resize_node(c, h, out, mode, coord)
    kernel = opdef_for(node).build(NodeContext(node, "cpu"))
    got = kernel(x, torch.zeros(0), torch.zeros(0), torch.tensor([1, c, out, out]))
    want = _reference(x.contiguous().numpy(), out, mode, coord)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    assert got.is_contiguous(memory_format=torch.channels_last)


def test_settled_strides_changes_only_the_strides_of_size_one_dims():
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 12).t().reshape(1, 12, 1, 2)
    y = settled_strides(x)
    assert torch.equal(x, y) and y.data_ptr() == x.data_ptr()
    assert [s for s, n in zip(y.stride(), y.shape) if n > 1] == [s for s, n in zip(x.stride(), x.shape) if n > 1]
    assert y.stride(0) == y.stride(2) == max(s * n for s, n in zip(x.stride(), x.shape) if n > 1)
    z = torch.ones(3, 4)
    assert settled_strides(z) is z
