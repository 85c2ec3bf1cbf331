"""The CPU backend's per-tensor ``QuantizeLinear`` / ``DequantizeLinear`` kernels (oneDNN's
where the parameters are constants and the shapes static, ``dnnl/quantize.py``; the torch
ones into planned memory otherwise) and its ``QAdd`` / ``Requantize`` ones
(``runtime/backends/cpu/quantize.py``): through the public API
against ``onnx.reference`` (the ONNX formulas: true division, ties to even, saturation,
infinities; a QDQ sum or requantisation as the DQ / Add / Q nodes compute it), bit for bit;
NaN as the op's own kernel gives it (``cpu_kernels="portable"``); channels-last and strided
inputs; written into the ``out=`` buffer; and what they decline."""
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
from fusegraph.runtime.backends.cpu import dnnl
from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
from fusegraph.runtime.backends.cpu.dnnl.quantize import QAddKernel
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


def _implementations(compiled) -> dict[str, str]:
    """op type -> "onednn" for a oneDNN primitive, else the kernel function's name."""
    return {c.node.op_type: "onednn" if isinstance(c.kernel, (DnnlKernel, QAddKernel))
            else getattr(c.kernel, "__name__", "") for c in compiled._executor.binding.calls}


@pytest.fixture(params=["onednn", "torch"])
def kernels(request, monkeypatch):
    """Which family runs the quantisation nodes: oneDNN's where it takes them (the default), or,
    with oneDNN's declining, the torch kernels into planned memory (what symbolic shapes and
    run-time parameters get; DynamicQuantizeLinear's is the op's own)."""
    if request.param == "torch":
        for name in ("quantize_kernel", "dequantize_kernel", "qadd_kernel", "requantize_kernel"):
            monkeypatch.setattr(dnnl, name, lambda ctx, resources: Decline("the test asks for the torch kernel", "dnnl"))
        monkeypatch.setattr(dnnl, "dynamic_quantize_kernel",
                            lambda ctx, opdef, resources: Decline("the test asks for the torch kernel", "dnnl"))
    return request.param


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
def test_quantize_and_dequantize_match_onnx_reference(qtype, zero, scale, inputs, kernels):
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
    # constants: oneDNN's (a uint8 quantisation, any dequantisation); read at run time: the torch kernels
    torch_only = inputs or kernels == "torch"
    want_q_impl = "quantize" if torch_only or qtype == T.INT8 and zero is not None else "onednn"
    want_dq_impl = "dequantize" if torch_only else "onednn"
    assert _implementations(compiled) == {"QuantizeLinear": want_q_impl, "DequantizeLinear": want_dq_impl}
    got = compiled.run(feeds)
    assert got["q"].dtype == want_q.dtype and np.array_equal(got["q"], want_q)
    assert np.array_equal(got["y"], want_y)


@pytest.mark.parametrize("qtype,zero", [(T.UINT8, 128), (T.UINT8, None), (T.INT8, -5), (T.INT8, 0)])
def test_nan_quantises_as_the_ops_own_kernel(qtype, zero, kernels):
    model = _qdq_model(qtype, 0.5, zero, False)
    x = _data(0.5)[0]
    x.reshape(-1)[20:24] = np.nan
    compiled = fg.compile(model)
    assert _implementations(compiled)["QuantizeLinear"] == \
        ("onednn" if qtype == T.UINT8 and kernels == "onednn" else "quantize")
    got = compiled.run({"x": x})
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


# ---------------------------------------------------------------- QAdd and Requantize

def _qadd_model(qtype: int, scales, zeros, relu: bool, const_side: int | None) -> onnx.ModelProto:
    """Q(x_i) -> DQ, added (one side a per-channel constant when ``const_side`` is 0 or 1),
    optionally ReLU, Q -> q (an output); fusegraph makes the middle one ``QAdd``."""
    np_type = {T.UINT8: np.uint8, T.INT8: np.int8}[qtype]
    inits = [numpy_helper.from_array(np.array(v, np.float32), f"s{k}") for k, v in zip("aby", scales)]
    inits += [numpy_helper.from_array(np.array(v, np_type), f"z{k}") for k, v in zip("aby", zeros)]
    nodes, inputs, sides = [], [], []
    for k in "ab":
        if const_side is not None and "ab"[const_side] == k:
            c = np.random.default_rng(3).integers(-128, 128, (8, 1, 1)) + (128 if qtype == T.UINT8 else 0)
            inits.append(numpy_helper.from_array(c.astype(np_type), f"c{k}"))
            nodes.append(H.make_node("DequantizeLinear", [f"c{k}", f"s{k}", f"z{k}"], [f"d{k}"]))
        else:
            inputs.append(H.make_tensor_value_info(f"x{k}", T.FLOAT, [1, 8, 5, 7]))
            nodes += [H.make_node("QuantizeLinear", [f"x{k}", f"s{k}", f"z{k}"], [f"q{k}"]),
                      H.make_node("DequantizeLinear", [f"q{k}", f"s{k}", f"z{k}"], [f"d{k}"])]
        sides.append(f"d{k}")
    nodes.append(H.make_node("Add", sides, ["sum"]))
    if relu:
        nodes.append(H.make_node("Relu", ["sum"], ["act"]))
    nodes.append(H.make_node("QuantizeLinear", ["act" if relu else "sum", "sy", "zy"], ["q"]))
    graph = H.make_graph(nodes, "qadd", inputs, [H.make_tensor_value_info("q", qtype, [1, 8, 5, 7])], inits)
    return H.make_model(graph, opset_imports=[H.make_opsetid("", 19)])


@pytest.mark.parametrize("qtype,zeros", [(T.UINT8, (128, 3, 7)), (T.INT8, (-5, 0, 2))])
@pytest.mark.parametrize("scales", [(0.25, 0.125, 0.5), (0.0371, 0.0213, 0.0442)])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("const_side", [None, 0, 1])
def test_qadd_matches_onnx_reference(qtype, zeros, scales, relu, const_side, kernels):
    """Dequantise, add, (ReLU,) quantise, bit for bit as ONNX writes it: scales of powers of two
    make sums that fall on ties; a per-channel constant on either side broadcasts."""
    model = _qadd_model(qtype, scales, zeros, relu, const_side)
    rng = np.random.default_rng(0)
    feeds = {i.name: (rng.standard_normal((1, 8, 5, 7)) * 40 * scales[0]).astype(np.float32) for i in model.graph.input}
    compiled = fg.compile(model, fg.Config(threads=2))
    assert _implementations(compiled)["QAdd"] == ("onednn" if kernels == "onednn" else "qadd")
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    got = compiled.run(feeds)["q"]
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("qtype,zeros", [(T.UINT8, (128, 3)), (T.INT8, (-5, 9))])
@pytest.mark.parametrize("scales", [(0.25, 0.5), (0.0371, 0.0442)])
def test_requantize_matches_onnx_reference(qtype, zeros, scales, kernels):
    """Q -> DQ -> Q with other parameters: fusegraph's ``Requantize``, bit for bit."""
    np_type = {T.UINT8: np.uint8, T.INT8: np.int8}[qtype]
    inits = [numpy_helper.from_array(np.array(s, np.float32), f"s{i}") for i, s in enumerate(scales)]
    inits += [numpy_helper.from_array(np.array(z, np_type), f"z{i}") for i, z in enumerate(zeros)]
    nodes = [H.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             H.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
             H.make_node("QuantizeLinear", ["d0", "s1", "z1"], ["q"])]
    graph = H.make_graph(nodes, "requantize", [H.make_tensor_value_info("x", T.FLOAT, [1, 8, 5, 7])],
                         [H.make_tensor_value_info("q", qtype, [1, 8, 5, 7])], inits)
    model = H.make_model(graph, opset_imports=[H.make_opsetid("", 19)])
    x = (np.random.default_rng(1).standard_normal((1, 8, 5, 7)) * 60 * scales[0]).astype(np.float32)
    compiled = fg.compile(model, fg.Config(threads=2))
    assert _implementations(compiled)["Requantize"] == ("onednn" if kernels == "onednn" else "requantize")
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    got = compiled.run({"x": x})["q"]
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("qtype,zeros", [(T.UINT8, (128, 3)), (T.INT8, (-5, 9))])
@pytest.mark.parametrize("steps", [("Mul",), ("Mul", "Add"), ("Sub", "Div")])
def test_requantize_with_affine_steps_matches_onnx_reference(qtype, zeros, steps, kernels, tmp_path):
    """Q -> DQ -> per-channel Mul / Add / Sub / Div -> Q (a pre-activation BatchNorm between two
    int8 convolutions): one ``Requantize`` with steps, bit for bit."""
    np_type = {T.UINT8: np.uint8, T.INT8: np.int8}[qtype]
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array(s, np.float32), f"s{i}") for i, s in enumerate((0.0371, 0.0442))]
    inits += [numpy_helper.from_array(np.array(z, np_type), f"z{i}") for i, z in enumerate(zeros)]
    nodes = [H.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             H.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["v0"])]
    for k, op in enumerate(steps):
        c = rng.uniform(0.5, 2.0, (8, 1, 1)).astype(np.float32) * rng.choice([-1, 1], (8, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(c, f"c{k}"))
        nodes.append(H.make_node(op, [f"v{k}", f"c{k}"], [f"v{k + 1}"]))
    nodes.append(H.make_node("QuantizeLinear", [f"v{len(steps)}", "s1", "z1"], ["q"]))
    graph = H.make_graph(nodes, "affine", [H.make_tensor_value_info("x", T.FLOAT, [1, 8, 5, 7])],
                         [H.make_tensor_value_info("q", qtype, [1, 8, 5, 7])], inits)
    model = H.make_model(graph, opset_imports=[H.make_opsetid("", 19)])
    x = (rng.standard_normal((1, 8, 5, 7)) * 60 * 0.0371).astype(np.float32)
    # the simplifier turns x / c into x * (1 / c) (within an ulp): kept as a division here
    compiled = fg.compile(model, fg.Config(threads=2, disabled_passes=("div_const",)))
    (node,) = [n for n in compiled._executor.graph.nodes if n.op_type == "Requantize"]
    assert [s.split()[0] for s in node.attrs["steps"]] == list(steps)
    assert (_implementations(compiled)["Requantize"] == "onednn") == (kernels == "onednn")
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    got = compiled.run({"x": x})["q"]
    assert got.dtype == want.dtype and np.array_equal(got, want)
    if kernels == "onednn" and qtype == T.UINT8:          # saved and loaded: the steps and their constants kept
        path = tmp_path / "affine.fgm"
        compiled.save(path)
        assert np.array_equal(fg.load(path, threads=2).run({"x": x})["q"], want)


def test_requantize_steps_decline_a_constant_first_in_a_division():
    """``c / DQ(x)`` is not a step on the running value: the float ops stay as they are."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(3, np.uint8), "z"),
             numpy_helper.from_array(np.full((8, 1, 1), 2.0, np.float32), "c")]
    nodes = [H.make_node("QuantizeLinear", ["x", "s", "z"], ["q0"]), H.make_node("DequantizeLinear", ["q0", "s", "z"], ["v"]),
             H.make_node("Div", ["c", "v"], ["w"]), H.make_node("QuantizeLinear", ["w", "s", "z"], ["q"])]
    graph = H.make_graph(nodes, "div", [H.make_tensor_value_info("x", T.FLOAT, [1, 8, 5, 7])],
                         [H.make_tensor_value_info("q", T.UINT8, [1, 8, 5, 7])], inits)
    compiled = fg.compile(H.make_model(graph, opset_imports=[H.make_opsetid("", 19)]))
    assert not [n for n in compiled._executor.graph.nodes if n.op_type == "Requantize"]
    x = np.random.default_rng(0).uniform(0.5, 5, (1, 8, 5, 7)).astype(np.float32)
    (want,) = ReferenceEvaluator(H.make_model(graph, opset_imports=[H.make_opsetid("", 19)])).run(None, {"x": x})
    assert np.array_equal(compiled.run({"x": x})["q"], want)


def _dynamic_model() -> onnx.ModelProto:
    graph = H.make_graph([H.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dql",
                         [H.make_tensor_value_info("x", T.FLOAT, [2, 3, 5, 7])],
                         [H.make_tensor_value_info("y", T.UINT8, [2, 3, 5, 7]), H.make_tensor_value_info("s", T.FLOAT, []),
                          H.make_tensor_value_info("z", T.UINT8, [])])
    return H.make_model(graph, opset_imports=[H.make_opsetid("", 19)])


@pytest.mark.parametrize("case", ["mixed", "ties", "positive", "negative", "constant"])
def test_dynamic_quantize_linear_on_onednn_matches_onnx_reference(case, kernels):
    """DynamicQuantizeLinear: its range, scale and zero point as ONNX computes them, then one
    oneDNN pass (or the torch one), bit for bit against ``onnx.reference``."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32) * np.float32(3)
    if case == "ties":          # values that land on k + 0.5 quanta of the scale the range gives
        x = np.linspace(-2.0, 3.0, x.size, dtype=np.float32).reshape(x.shape)
        s = np.float32(5.0) / np.float32(255)
        x.reshape(-1)[1:40] = (np.arange(1, 40, dtype=np.float32) + np.float32(0.5)) * s
    elif case == "positive":
        x = np.abs(x) + np.float32(0.5)
    elif case == "negative":
        x = -np.abs(x) - np.float32(0.5)
    elif case == "constant":
        x = np.full_like(x, 0.75)
    model = _dynamic_model()
    compiled = fg.compile(model, fg.Config(threads=2))
    (call,) = compiled._executor.binding.calls
    assert (type(call.kernel).__name__ == "DynamicQuantizer") == (kernels == "onednn")
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = compiled.run({"x": x})
    for name, w in zip(("y", "s", "z"), want):
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w), name


def test_dynamic_quantize_linear_nan_and_inf_as_the_ops_own_kernel():
    model = _dynamic_model()
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 7)).astype(np.float32)
    for bad in (np.nan, np.inf):
        x.reshape(-1)[3] = bad
        got = fg.compile(model).run({"x": x})
        want = fg.compile(model, fg.Config(cpu_kernels="portable")).run({"x": x})
        for name in ("y", "s", "z"):
            assert np.array_equal(got[name], want[name], equal_nan=True), (bad, name)
