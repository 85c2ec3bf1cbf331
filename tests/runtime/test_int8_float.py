"""QConv / QLinear on oneDNN's float32 kernels (``dnnl/int8_float.py``): what runs on a CPU
whose int8 kernels do not sum exactly (AVX2), forced on any CPU here (``int8_models.int8_form``).

Each QDQ model is checked against onnxruntime ORT_DISABLE_ALL on the same file (DequantizeLinear,
the float32 product, QuantizeLinear: the definition): within one quantisation step everywhere,
and equal almost everywhere (a float32 sum in another order may round a tie the other way).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg

import int8_models as M

pytest.importorskip("onnxruntime")
from fusegraph.runtime.backends.cpu.dnnl import available  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN does not load here")
CFG = fg.Config(threads=2)
FORM = "(float32 on dequantised int8)"
NP = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}


def _conv_model(c_in=16, c_out=32, group=1, stride=1, pads=(1, 1, 1, 1), k=3, x_type=TensorProto.UINT8,
                y_type=TensorProto.UINT8, float_out=False, relu=False, bias=None, hw=10, seed=0) -> onnx.ModelProto:
    """DQ(x) -> Conv(DQ(w) per output channel, float bias) [-> Relu] -> Q [-> DQ]: one QConv."""
    rng = np.random.default_rng(seed)
    x_zero = 128 if x_type == TensorProto.UINT8 else -5
    y_zero = 120 if y_type == TensorProto.UINT8 else 3
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(x_zero, NP[x_type]),
             "w": rng.integers(-127, 128, (c_out, c_in // group, k, k), dtype=np.int8),
             "ws": (rng.uniform(0.5, 1.5, c_out) * 0.6 / np.sqrt(c_in // group * k * k) / 127 * 4).astype(np.float32),
             "wz": np.zeros(c_out, np.int8),
             "b": bias if bias is not None else (rng.standard_normal(c_out) * 0.1).astype(np.float32),
             "ys": np.array(0.03, np.float32), "yz": np.array(y_zero, NP[y_type])}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["cv"], group=group, strides=[stride, stride],
                              pads=list(pads), kernel_shape=[k, k])]
    last = "cv"
    if relu:
        nodes.append(helper.make_node("Relu", ["cv"], ["r"]))
        last = "r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["q" if float_out else "y"]))
    if float_out:
        nodes.append(helper.make_node("DequantizeLinear", ["q", "ys", "yz"], ["y"]))
    ho = (hw + pads[0] + pads[2] - k) // stride + 1
    wo = (hw + pads[1] + pads[3] - k) // stride + 1
    g = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", x_type, [1, c_in, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT if float_out else y_type,
                                                         [1, c_out, ho, wo])],
                          [numpy_helper.from_array(v, k_) for k_, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


def _gemm_model(k=48, n=40, trans_b=True, relu=True, y_type=TensorProto.UINT8, seed=1) -> onnx.ModelProto:
    """One QLinear: ``trans_b``: DQ(x [10, K]) -> Gemm(DQ(w [N, K]) per row, b, transB=1); else
    DQ(x [2, 5, K]) -> MatMul(DQ(w [K, N]) per column) + b; [-> Relu] -> Q."""
    rng = np.random.default_rng(seed)
    rows = (10,) if trans_b else (2, 5)
    w = rng.integers(-127, 128, (n, k) if trans_b else (k, n), dtype=np.int8)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8), "w": w,
             "ws": (rng.uniform(0.5, 1.5, n) * 0.01).astype(np.float32), "wz": np.zeros(n, np.int8),
             "b": (rng.standard_normal(n) * 0.1).astype(np.float32),
             "ys": np.array(0.04, np.float32), "yz": np.array(100 if y_type == TensorProto.UINT8 else -7, NP[y_type])}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if trans_b else 1)]
    if trans_b:
        nodes.append(helper.make_node("Gemm", ["xd", "wd", "b"], ["a"], transB=1))
    else:
        nodes += [helper.make_node("MatMul", ["xd", "wd"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"])]
    last = "a"
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["r"]))
        last = "r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["y"]))
    g = helper.make_graph(nodes, "qlinear", [helper.make_tensor_value_info("x", TensorProto.UINT8, [*rows, k])],
                          [helper.make_tensor_value_info("y", y_type, [*rows, n])],
                          [numpy_helper.from_array(v, k_) for k_, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


def _float_calls(cm, op: str) -> list:
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatForm
    calls = [c for c in cm._executor.binding.calls if c.node.op_type == op]
    declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
    for c in calls:
        k = getattr(c.kernel, "fast", c.kernel)
        assert isinstance(k, FloatForm), (c.node.name, type(k).__name__, declined.get(c.node.name))
        assert k.impl.endswith(FORM) and not k.impl.startswith("ref"), k.impl
        assert cm.report.kernels["implementations"].get(k.impl, 0) >= 1
    return calls


def _against_ort(cm, m, x_shape, x_type, step: float, seeds=(0, 1, 2)) -> None:
    """Every output within one ``step`` of onnxruntime ORT_DISABLE_ALL, and at most 1 % of them
    one step off (ties rounded the other way after a sum in another order)."""
    lo, hi = (0, 256) if x_type in (TensorProto.UINT8, np.uint8) else (-128, 128)
    off = total = 0
    for seed in seeds:
        feeds = {"x": np.random.default_rng(100 + seed).integers(lo, hi, x_shape).astype(NP[x_type])}
        y = cm.run(feeds)["y"]
        (ref,) = M.ort_run(m, feeds)
        assert y.dtype == ref.dtype and y.shape == ref.shape
        steps = np.abs(y.astype(np.float64) - ref.astype(np.float64)) / (step if y.dtype == np.float32 else 1.0)
        assert steps.max() <= 1.001, steps.max()
        off += int((steps > 0.5).sum())
        total += steps.size
    assert off <= 0.01 * total, (off, total)


@pytest.mark.parametrize("case", [
    dict(),                                                        # 3x3, pads 1
    dict(group=4, c_out=16),                                       # grouped
    dict(group=16, c_out=16, stride=2),                            # depthwise, stride 2
    dict(pads=(0, 1, 1, 0), k=2, relu=True),                       # asymmetric pads, a Relu
    dict(x_type=TensorProto.INT8, y_type=TensorProto.INT8),        # int8 activations
    dict(float_out=True, c_out=24),                                # float32 on the output's grid
    dict(k=1, pads=(0, 0, 0, 0), c_out=64, relu=True),             # 1x1
])
def test_quantised_convolutions_on_float_kernels(case, monkeypatch):
    """A QConv of each geometry runs as the float32 form (a oneDNN float convolution, not a
    reference one, between the quantising reorders), within one step of onnxruntime."""
    M.int8_form(monkeypatch, "float")
    m = _conv_model(**case)
    cm = fg.compile(m, CFG)
    assert len(_float_calls(cm, "QConv")) == 1
    x_type = case.get("x_type", TensorProto.UINT8)
    _against_ort(cm, m, (1, 16, 10, 10), x_type, 0.03)


@pytest.mark.parametrize("trans_b,relu,y_type", [(True, True, TensorProto.UINT8), (False, False, TensorProto.INT8)])
def test_quantised_products_on_float_kernels(trans_b, relu, y_type, monkeypatch):
    """A QLinear of a Gemm's transposed weight and of a MatMul over a 3-D input ([2, 5, K] read
    as 10 rows), with and without a Relu, to uint8 / int8: the float32 form, within one step of
    onnxruntime."""
    M.int8_form(monkeypatch, "float")
    m = _gemm_model(trans_b=trans_b, relu=relu, y_type=y_type)
    cm = fg.compile(m, CFG)
    assert len(_float_calls(cm, "QLinear")) == 1
    _against_ort(cm, m, (10, 48) if trans_b else (2, 5, 48), TensorProto.UINT8, 0.04)


def test_saturation_and_ties_as_quantize_linear(monkeypatch):
    """Outputs far outside the output type's range saturate (both ends), and a result the
    product makes exactly half a step from two grid points rounds to the even one, as
    QuantizeLinear does: a 1x1 convolution with weight 1 and scales of one, so the float result
    is the input itself."""
    M.int8_form(monkeypatch, "float")
    inits = {"xs": np.array(1.0, np.float32), "xz": np.array(0, np.int8), "w": np.ones((8, 8, 1, 1), np.int8) * np.eye(8, dtype=np.int8)[:, :, None, None],
             "ws": np.ones(8, np.float32), "wz": np.zeros(8, np.int8), "b": np.full(8, 0.5, np.float32),
             "ys": np.array(1.0, np.float32), "yz": np.array(0, np.int8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["cv"], kernel_shape=[1, 1]),
             helper.make_node("Mul", ["cv", "three"], ["m3"]),
             helper.make_node("QuantizeLinear", ["m3", "ys", "yz"], ["y"])]
    inits["three"] = np.array(3.0, np.float32)
    g = helper.make_graph(nodes, "ties", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 8, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 8, 4, 4])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 8, 4, 8)[:, :, :, :4].copy()
    cm = fg.compile(m, CFG)
    if not any(c.node.op_type == "QConv" for c in cm._executor.binding.calls):
        pytest.skip("the scale did not fold into the convolution here")
    _float_calls(cm, "QConv")
    y = cm.run({"x": x})["y"]
    (ref,) = M.ort_run(m, {"x": x})
    assert np.array_equal(y, ref)
    assert (y == 127).any() and (y == -128).any()


def test_int32_sums_and_nan_constants_decline_to_the_reference(monkeypatch):
    """A ConvInteger (an exact int32 sum, which float32 would round) and a quantised output
    whose bias is NaN (the epilogue could hold NaN, which QuantizeLinear maps its own way)
    decline with the reason; the op's own kernel runs them, as onnxruntime computes them."""
    M.int8_form(monkeypatch, "float")
    bias = (np.random.default_rng(0).standard_normal(32) * 0.1).astype(np.float32)
    bias[3] = np.nan
    m = _conv_model(bias=bias)
    cm = fg.compile(m, CFG)
    declined = {d["op"]: d["reason"] for d in cm.report.kernels["declined"]}
    assert "NaN" in declined.get("QConv", ""), declined
    feeds = {"x": np.random.default_rng(1).integers(0, 256, (1, 16, 10, 10)).astype(np.uint8)}
    (ref,) = M.ort_run(m, feeds)
    assert np.array_equal(cm.run(feeds)["y"], ref)

    rng = np.random.default_rng(2)
    inits = {"w": rng.integers(-120, 121, (6, 4, 3, 3), dtype=np.int8), "xz": np.array(121, np.uint8)}
    g = helper.make_graph([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"])], "ci",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 7, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 6, 5, 5])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    mi = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    mi.ir_version = 8
    ci = fg.compile(mi, CFG)
    declined = {d["op"]: d["reason"] for d in ci.report.kernels["declined"]}
    assert "int32" in declined.get("QConv", ""), declined
    feeds = {"x": rng.integers(0, 256, (1, 4, 7, 7)).astype(np.uint8)}
    (ref,) = M.exact_run(mi, feeds)
    assert np.array_equal(ci.run(feeds)["y"], ref)


def test_this_cpu_s_choice():
    """Unforced: the int8 kernels where this CPU sums int8 exactly (VNNI / AMX), the float32
    form elsewhere; the weight the graph keeps is the int8 one either way (the artifact's)."""
    from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatForm
    m = _conv_model()
    cm = fg.compile(m, CFG)
    (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == "QConv"]
    kernel = getattr(call.kernel, "fast", call.kernel)
    if M.int8_kernels_exact():
        assert isinstance(kernel, DnnlKernel) and M.int8_dot_products(kernel.impl), kernel.impl
    else:
        assert isinstance(kernel, FloatForm), type(kernel).__name__
    assert call.node.inputs[1].dtype == fg.ir.DType.INT8


def test_float_form_round_trips_through_an_artifact(tmp_path, monkeypatch):
    """Saved and loaded, a model whose QConv runs the float32 form stores its int8 weight (not
    the dequantised one) and runs the same numbers on the float32 form again."""
    M.int8_form(monkeypatch, "float")
    m = _conv_model(relu=True)
    cm = fg.compile(m, CFG)
    path = tmp_path / "q.fgm"
    cm.save(path)
    loaded = fg.load(path)
    _float_calls(loaded, "QConv")
    feeds = {"x": np.random.default_rng(5).integers(0, 256, (1, 16, 10, 10)).astype(np.uint8)}
    assert np.array_equal(loaded.run(feeds)["y"], cm.run(feeds)["y"])
    assert path.stat().st_size < 32 * 16 * 9 * 4       # int8 weights: a quarter of the float32 ones


def test_a_slow_reorder_declines_with_the_reason(monkeypatch):
    """Where oneDNN would dequantise or quantise with its generic element loop, the node
    declines naming it, and the op's own kernel gives onnxruntime's numbers."""
    from fusegraph.runtime.backends.cpu.dnnl import int8_float
    M.int8_form(monkeypatch, "float")
    real = int8_float.create

    def create(what, make):
        prim = real(what, make)
        if what == "int8 node's reorder":
            prim.impl = "simple:any"               # what oneDNN names its generic loop
        return prim
    monkeypatch.setattr(int8_float, "create", create)
    m = _conv_model()
    cm = fg.compile(m, CFG)
    declined = {d["op"]: d["reason"] for d in cm.report.kernels["declined"]}
    assert "generic reorder (simple:any)" in declined.get("QConv", ""), declined
    _against_ort(cm, m, (1, 16, 10, 10), TensorProto.UINT8, 0.03)
