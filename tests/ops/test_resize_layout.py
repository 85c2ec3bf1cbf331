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


@pytest.mark.parametrize("mode,coord", [("linear", "half_pixel"), ("cubic", "align_corners"),
                                        ("nearest", "asymmetric"), ("linear", "tf_crop_and_resize")])
@pytest.mark.parametrize("channels_last", [False, True])
def test_out_receives_what_the_kernel_returns(mode, coord, channels_last, monkeypatch):
    """With ``out=`` (a planned buffer) the kernel writes the very values it returns without it:
    through ATen's out form of the upsampling kernel where ``interpolate`` runs, else a copy."""
    from fusegraph.ops import resize
    used = []

    def spy(plan, x, out):
        used.append(real(plan, x, out))
        return used[-1]
    real = resize.interpolate_into
    monkeypatch.setattr(resize, "interpolate_into", spy)
    c, h, out = 8, 6, 12
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, c, h, h)).astype(np.float32))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    node = _resize_node(c, h, out, mode, coord)
    if coord == "tf_crop_and_resize":      # an roi: the tables path, no interpolate
        node.inputs[1].const = torch.tensor([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.8], dtype=torch.float32)
    kernel = opdef_for(node).build(NodeContext(node, "cpu"))
    args = (node.inputs[1].const, torch.zeros(0), torch.tensor([1, c, out, out]))
    want = kernel(x, *args)
    buffer = torch.full((1, c, out, out), float("nan"))
    if channels_last:
        buffer = buffer.contiguous(memory_format=torch.channels_last)
    got = kernel(x, *args, out=buffer)
    assert got is buffer and torch.equal(buffer, want)
    assert used == [coord != "tf_crop_and_resize"]
