"""The CPU backend's per-tensor ``QuantizeLinear`` / ``DequantizeLinear`` kernels
(``runtime/backends/cpu/quantize.py``): through the public API against ``onnx.reference`` (the
ONNX formulas: true division, ties to even, saturation, infinities), bit for bit; NaN as the
op's own kernel gives it (``cpu_kernels="portable"``); channels-last and strided inputs;
written into the ``out=`` buffer; and what they decline."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T, helper as H, numpy_helper
from onnx.reference import ReferenceEvaluator

import fusegraph as fg
from fusegraph.ir import DType, Graph
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.quantize import dequantize_kernel, quantize_kernel
from fusegraph.runtime.backends.cpu.workspace import Workspace
from fusegraph.runtime.backends.protocol import Decline


def _qdq_model(qtype: int, scale: float, zero: int | None, inputs: bool) -> onnx.ModelProto:
    """x -> QuantizeLinear -> q (an output) -> DequantizeLinear -> y; scale and zero point as
    constants, or (``inputs``) as graph inputs: the kernels read them at run time."""
    np_type = {T.UINT8: np.uint8, T.INT8: np.int8}[qtype]
    params = [numpy_helper.from_array(np.array(scale, np.float32), "s")]
    if zero is not None:
        params.append(numpy_helper.from_array(np.array(zero, np_type), "zp"))
    q_in = ["x", "s"] + (["zp"] if zero is not None else [])
    nodes = [H.make_node("QuantizeLinear", q_in, ["q"]), H.make_node("DequantizeLinear", ["q"] + q_in[1:], ["y"])]
    graph_inputs = [H.make_tensor_value_info("x", T.FLOAT, [2, 3, 5, 7])]
    if inputs:
        graph_inputs += [H.make_tensor_value_info(p.name, p.data_type, []) for p in params]
        params = []
    if zero is None:
        qtype = T.UINT8
    graph = H.make_graph(nodes, "qdq", graph_inputs,
                         [H.make_tensor_value_info("q", qtype, [2, 3, 5, 7]),
                          H.make_tensor_value_info("y", T.FLOAT, [2, 3, 5, 7])], initializer=params)
    return H.make_model(graph, opset_imports=[H.make_opsetid("", 19)])


HUGE = slice(12, 16)      # +-inf, +-1e30: onnx.reference casts them to int32 before saturating


def _reciprocal_differs(scale: float) -> np.ndarray:
    """Float32 values within 3 ulps of a tie (k + 0.5 quanta, 0 <= k < 100) that ``x / scale``
    and ``x * (1 / scale)`` round to different integers."""
    s = np.float32(scale)
    found = []
    for k in range(100):
        x = np.float32((k + 0.5) * float(s))
        for _ in range(3):
            if np.rint(x / s) != np.rint(x * (np.float32(1) / s)):
                found.append(x)
            x = np.nextafter(x, np.float32(-np.inf), dtype=np.float32)
    return np.array(found[:8], np.float32)


def _data(scale: float) -> tuple[np.ndarray, int]:
    """Random values across and beyond the range, exact ties (k + 0.5 quanta), infinities and
    values past int32 (at ``HUGE``), and values a reciprocal would round the other way (their
    count second)."""
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32) * np.float32(60 * scale)
    flat = x.reshape(-1)
    flat[:12] = (np.arange(12, dtype=np.float32) - 6 + np.float32(0.5)) * np.float32(scale)
    flat[HUGE] = [np.inf, -np.inf, np.float32(1e30), np.float32(-1e30)]
    near = _reciprocal_differs(scale)
    flat[16:16 + len(near)] = near
    return x, len(near)


@pytest.mark.parametrize("qtype,zero", [(T.UINT8, 128), (T.UINT8, 3), (T.INT8, -5), (T.INT8, 0), (T.UINT8, None)])
@pytest.mark.parametrize("scale", [0.25, 3.0, 0.0371])
@pytest.mark.parametrize("inputs", [False, True])
def test_quantize_and_dequantize_match_onnx_reference(qtype, zero, scale, inputs):
    model = _qdq_model(qtype, scale, zero, inputs)
    x, near = _data(scale)
    assert near > 0 or scale == 0.25          # a power of two: its reciprocal is exact
    feeds = {"x": x}
    if inputs:
        feeds["s"] = np.array(scale, np.float32)
        if zero is not None:
            feeds["zp"] = np.array(zero, {T.UINT8: np.uint8, T.INT8: np.int8}[qtype])
    want_q, want_y = ReferenceEvaluator(model).run(None, {**feeds, "x": np.where(np.isfinite(x) & (np.abs(x) < 1e9), x, 0)})
    lo, hi = (0, 255) if qtype == T.UINT8 or zero is None else (-128, 127)
    want_q.reshape(-1)[HUGE] = [hi, lo, hi, lo]        # ONNX: saturate (as onnxruntime does)
    want_y.reshape(-1)[HUGE] = (want_q.reshape(-1)[HUGE].astype(np.float32) - np.float32(zero or 0)) * np.float32(scale)
    compiled = fg.compile(model, fg.Config(threads=2))
    names = {c.node.op_type: getattr(c.kernel, "__name__", "") for c in compiled._executor.binding.calls}
    assert names == {"QuantizeLinear": "quantize", "DequantizeLinear": "dequantize"}, names
    got = compiled.run(feeds)
    assert got["q"].dtype == want_q.dtype and np.array_equal(got["q"], want_q)
    assert np.array_equal(got["y"], want_y)


@pytest.mark.parametrize("qtype,zero", [(T.UINT8, 128), (T.INT8, -5)])
def test_nan_quantises_as_the_ops_own_kernel(qtype, zero):
    model = _qdq_model(qtype, 0.5, zero, False)
    x = _data(0.5)[0]
    x.reshape(-1)[20:24] = np.nan
    got = fg.compile(model).run({"x": x})
    want = fg.compile(model, fg.Config(cpu_kernels="portable")).run({"x": x})
    assert np.array_equal(got["q"], want["q"])
    np.testing.assert_array_equal(got["y"], want["y"])


def _node(op: str, in_type: DType, out_type: DType, scale, zero=None, attrs=None):
    g = Graph("q")
    x = g.add_input("x", in_type, (1, 8, 4, 4))
    ins = [x, g.add_constant("s", scale)]
    if zero is not None:
        ins.append(g.add_constant("zp", zero))
    node = g.add_node(op, ins, outputs=1, attrs=attrs or {}, version=19)
    node.outputs[0].dtype = out_type
    node.outputs[0].shape = (1, 8, 4, 4)
    return NodeContext(node, "cpu")


def test_channels_last_and_strided_inputs_into_out_buffers():
    ctx = _node("QuantizeLinear", DType.FLOAT, DType.UINT8, torch.tensor(0.1), torch.tensor(7, dtype=torch.uint8))
    q = quantize_kernel(ctx, Workspace())
    x = torch.randn(1, 8, 4, 4) * 5
    want = torch.clamp(torch.round(x / torch.tensor(0.1)) + 7, 0, 255).to(torch.uint8)
    for given in (x.to(memory_format=torch.channels_last), x.transpose(2, 3).contiguous().transpose(2, 3),
                  torch.cat([x, x], 3)[..., ::2].clone().copy_(x)):
        out = torch.empty(1, 8, 4, 4, dtype=torch.uint8).to(memory_format=torch.channels_last)
        assert q(given, torch.tensor(0.1), torch.tensor(7, dtype=torch.uint8), out=out) is out
        assert torch.equal(out, want)
    dctx = _node("DequantizeLinear", DType.UINT8, DType.FLOAT, torch.tensor(0.1), torch.tensor(7, dtype=torch.uint8))
    dq = dequantize_kernel(dctx)
    out = torch.empty(1, 8, 4, 4)
    assert dq(want, torch.tensor(0.1), torch.tensor(7, dtype=torch.uint8), out=out) is out
    assert torch.equal(out, (want.float() - 7) * torch.tensor(0.1))


def test_what_they_decline():
    per_channel = _node("QuantizeLinear", DType.FLOAT, DType.UINT8, torch.full((8,), 0.1), torch.zeros(8, dtype=torch.uint8))
    assert isinstance(quantize_kernel(per_channel, Workspace()), Decline)
    blocked = _node("QuantizeLinear", DType.FLOAT, DType.INT8, torch.tensor(0.1), attrs={"block_size": 2})
    assert isinstance(quantize_kernel(blocked, Workspace()), Decline)
    wide = _node("DequantizeLinear", DType.INT32, DType.FLOAT, torch.tensor(0.1))
    assert "not int8 / uint8" in quantize_kernel(
        _node("QuantizeLinear", DType.FLOAT, DType.INT16, torch.tensor(0.1)), Workspace()).reason
    assert isinstance(dequantize_kernel(wide), Decline)
