"""onnxruntime-quantised models (``quantize_static``: QDQ, and QOperator) through the public
API: the quantised products become ``fusegraph::QConv`` / ``QLinear`` on oneDNN's int8 kernels
(where this CPU sums int8 exactly: AVX512-VNNI / AVX-VNNI / AMX), the outputs match
onnxruntime ORT_DISABLE_ALL on the same file (the independent oracle) within the stated
rounding bounds, and stay close to the fp32 model; QOperator files with only standard ops
(QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger) run on the same ops; files with
onnxruntime's ``com.microsoft`` QOperator ops are refused with a message that says to
re-quantise as QDQ; a saved ``.fgm`` loads with no pass and gives the same outputs."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import ArtifactError, UnsupportedOpError
from fusegraph.passes.qdq_propagate import rounding_bound
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.int8_support import int8_exact

import int8_models as M

CFG = fg.Config(threads=2)
SEEDS = (3, 4, 5)
INT8_OPS = ("QConv", "QLinear")
FLOAT_PRODUCTS = ("Conv", "MatMul", "Gemm", "FusedConv", "Linear", "ConvInteger", "MatMulInteger",
                  "QLinearConv", "QLinearMatMul")

pytest.importorskip("onnxruntime.quantization")
needs_int8_kernels = pytest.mark.skipif(not M.int8_kernels_exact(), reason=M.INT8_KERNELS_WHY)


def _qdq(tmp_path_factory, name, model, fmt="QDQ"):
    return M.quantize(model, tmp_path_factory.mktemp(name), name, fmt)


@pytest.fixture(scope="module")
def conv_gemm(tmp_path_factory):
    m = M.conv_net(head="Gemm")
    return m, _qdq(tmp_path_factory, "conv_gemm", m)


@pytest.fixture(scope="module")
def conv_matmul(tmp_path_factory):
    m = M.conv_net(head="MatMul")
    return m, _qdq(tmp_path_factory, "conv_matmul", m)


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    m = M.attention_block()
    return m, _qdq(tmp_path_factory, "attention", m)


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    m = M.matmul_block()
    return m, _qdq(tmp_path_factory, "block", m)


def last_step(q: onnx.ModelProto) -> float:
    """The scale of the QuantizeLinear whose value the graph output dequantises."""
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    by_out = {o: n for n in q.graph.node for o in n.output}
    dq = by_out[q.graph.output[0].name]
    assert dq.op_type == "DequantizeLinear"
    return float(inits[dq.input[1]])



def int8_calls(cm) -> list:
    """The int8 product calls of ``cm``: each bound to a oneDNN int8 implementation (not a
    reference one), counted in ``report.kernels``, none declined."""
    from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
    calls = [c for c in cm._executor.binding.calls if c.node.op_type in INT8_OPS]
    declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
    impls = cm.report.kernels["implementations"]
    for c in calls:
        k = getattr(c.kernel, "kernel", c.kernel)
        k = getattr(k, "fast", k)
        assert c.node.name not in declined, f"{c.node.name} declined: {declined[c.node.name]}"
        assert isinstance(k, DnnlKernel), f"{c.node.name} runs {type(k).__name__}"
        assert M.int8_dot_products(k.impl), (c.node.name, k.impl)
        assert impls.get(k.impl, 0) >= 1, (k.impl, impls)
    return calls


def onednn_call(cm, op: str):
    """The one ``op`` call of ``cm``, checked to run a oneDNN implementation that is not a
    reference one (a guarded call's fast side; a QConv / QLinear's float32 form counts)."""
    from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatForm
    (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == op]
    kernel = getattr(call.kernel, "fast", call.kernel)
    assert isinstance(kernel, (DnnlKernel, FloatForm)) and not kernel.impl.startswith("ref"), \
        (type(kernel).__name__, cm.report.kernels["declined"])
    return call


def check_form(cm, form: str) -> None:
    """Every QConv / QLinear of ``cm`` runs ``form`` (``M.int8_form``): the oneDNN int8
    kernels, or the float32 form: a oneDNN float32 primitive that is not a reference one
    between quantising reorders."""
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatForm
    if form == "int8":
        int8_calls(cm)
        return
    declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
    for c in cm._executor.binding.calls:
        if c.node.op_type in INT8_OPS:
            k = getattr(c.kernel, "fast", c.kernel)
            assert isinstance(k, FloatForm), (c.node.name, type(k).__name__, declined.get(c.node.name))
            assert not k.impl.startswith("ref") and k.impl.endswith("(float32 on dequantised int8)"), k.impl


def check_ops(cm, n_products: int) -> None:
    """Every product of the quantised model is an int8 op: ``n_products`` of them, no float one."""
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert sum(ops[o] for o in INT8_OPS) == n_products, ops
    assert not any(ops[o] for o in FLOAT_PRODUCTS), ops


def compare(cm, q, fp32, max_steps, mean_steps, seeds=SEEDS, fp32_limit=5e-2, oracle=M.ort_run):
    """fusegraph against onnxruntime ORT_DISABLE_ALL on the QDQ file (in steps of the output's
    quantisation; ``oracle``: ``M.exact_run`` for a file of integer ops) and against the fp32
    model (relative L2, no worse than the oracle's x 1.1 + a little)."""
    step = last_step(q)
    for seed in seeds:
        feeds = M.feeds_for(fp32, seed)
        (y,) = cm.run(feeds).values()
        (ref,) = oracle(q, feeds)
        (yf,) = M.ort_run(fp32, feeds)
        diff = np.abs(np.asarray(y, np.float64) - ref) / step
        assert diff.max() <= max_steps + 1e-3, f"seed {seed}: {diff.max()} steps (bound {max_steps})"
        assert diff.mean() <= mean_steps, f"seed {seed}: mean {diff.mean()} steps"
        assert M.rel_l2(y, yf) < fp32_limit and M.rel_l2(y, yf) <= 1.1 * M.rel_l2(ref, yf) + 5e-3, (M.rel_l2(y, yf), M.rel_l2(ref, yf))


# ---------------------------------------------------------------- QDQ files

@pytest.mark.parametrize("form", ["int8", "float"])
def test_conv_net_gemm_head(conv_gemm, form, monkeypatch):
    """Conv + Relu, a residual Add, MaxPool, GlobalAveragePool, a Gemm head: 4 QConv + 1
    QLinear, the residual folded into the QConv's sum post-op. A single QDQ convolution
    matches onnxruntime exactly; the residual QConv rounds once where onnxruntime rounds
    twice (``qdq_residual``), a difference the later products carry: the logits stay within
    one step. On the int8 kernels where they are exact, and on the float32 form (``form``)."""
    M.int8_form(monkeypatch, form)
    fp32, q = conv_gemm
    cm = fg.compile(q, CFG)
    check_ops(cm, 5)
    check_form(cm, form)
    compare(cm, q, fp32, max_steps=1, mean_steps=0.5)


@pytest.mark.parametrize("form", ["int8", "float"])
def test_conv_net_matmul_head(conv_matmul, form, monkeypatch):
    """The head as MatMul + Add: onnxruntime quantises the product, then the sum; fusegraph adds
    the bias before its one rounding (``qdq_bias``), which differs by at most
    ``rounding_bound(s_product, s_out)`` steps."""
    fp32, q = conv_matmul
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    scales = {n.output[0]: float(inits[n.input[1]]) for n in q.graph.node if n.op_type == "QuantizeLinear"}
    bound = rounding_bound(scales["mm_QuantizeLinear_Output"], scales["y_QuantizeLinear_Output"])
    M.int8_form(monkeypatch, form)
    cm = fg.compile(q, CFG)
    check_ops(cm, 5)
    check_form(cm, form)
    compare(cm, q, fp32, max_steps=bound, mean_steps=0.75)


@pytest.mark.parametrize("form", ["int8", "float"])
def test_matmul_block(block, form, monkeypatch):
    """MatMul + Add, Relu, MatMul + Add, a residual Add, MatMul: 3 QLinear (each float bias
    added after the product's clamp, ``post_bias``: calibration on 8 inputs gives each
    product's own quantisation a range its sum's reaches beyond) and a QAdd. Each fused
    rounding differs from onnxruntime's double one by its ``rounding_bound``; the next product
    carries that difference on (a sum over the features), so the output is held to a few
    steps, the mean to under one."""
    fp32, q = block
    M.int8_form(monkeypatch, form)
    cm = fg.compile(q, CFG)
    check_ops(cm, 3)
    check_form(cm, form)
    assert collections.Counter(n.op_type for n in cm.graph.nodes)["QAdd"] == 1
    assert sum("post_bias" in n.attrs for n in cm.graph.nodes if n.op_type == "QLinear") == 2
    compare(cm, q, fp32, max_steps=4, mean_steps=0.75)


@needs_int8_kernels
def test_products_of_two_activations_run_on_onednn_int8(attention):
    """An attention block's q @ k^T and probs @ v, quantised on both sides (MatMul(DQ, DQ)),
    become QMatMul on oneDNN's int8 matmul (a uint8 second operand moved into int8): within one
    step of onnxruntime ORT_DISABLE_ALL at every int8 output, as close to fp32 as onnxruntime."""
    from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
    fp32, q = attention
    cm = fg.compile(q, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QMatMul"] == 2 and not any(ops[o] for o in FLOAT_PRODUCTS), ops
    for c in cm._executor.binding.calls:
        if c.node.op_type == "QMatMul":
            kernel = getattr(c.kernel, "kernel", c.kernel)
            assert isinstance(kernel, DnnlKernel) and M.int8_dot_products(kernel.impl), (c.node.name, kernel.impl)
    compare(cm, q, fp32, max_steps=1, mean_steps=0.05, fp32_limit=0.15)     # 8 steps of a softmax: coarse


def test_products_of_two_activations_on_float_kernels(attention, monkeypatch):
    """The same attention block on the float32 form (as on a CPU whose int8 sums are not
    exact): both QMatMuls, and every QLinear, dequantise their operands into a oneDNN float32
    matmul; as close to onnxruntime ORT_DISABLE_ALL and to fp32 as the int8 kernels are."""
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatForm
    M.int8_form(monkeypatch, "float")
    fp32, q = attention
    cm = fg.compile(q, CFG)
    calls = [c for c in cm._executor.binding.calls if c.node.op_type in ("QMatMul", *INT8_OPS)]
    assert sum(c.node.op_type == "QMatMul" for c in calls) == 2
    for c in calls:
        assert isinstance(c.kernel, FloatForm) and not c.kernel.impl.startswith("ref"), (c.node.name, c.kernel)
    compare(cm, q, fp32, max_steps=1, mean_steps=0.05, fp32_limit=0.15)


def test_single_product_bias_bound(tmp_path):
    """One MatMul + Add: the only difference from onnxruntime is ``qdq_bias``'s single
    rounding, so the bound is exactly ``rounding_bound`` and most outputs agree."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((48, 24)) * np.sqrt(2 / 48)).astype(np.float32)
    b = (rng.standard_normal(24) * 0.5).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "mm_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 24])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    fp32 = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    fp32.ir_version = 8
    q = M.quantize(fp32, tmp_path, "mm_bias")
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    scales = {n.output[0]: float(inits[n.input[1]]) for n in q.graph.node if n.op_type == "QuantizeLinear"}
    bound = rounding_bound(scales["m_QuantizeLinear_Output"], scales["y_QuantizeLinear_Output"])
    cm = fg.compile(q, CFG)
    check_ops(cm, 1)
    # 8 calibration inputs clip the tails of this product's range: onnxruntime's own error is ~6e-2
    compare(cm, q, fp32, max_steps=bound, mean_steps=0.5, fp32_limit=1e-1)


def test_gemm_biases_shared_through_identity(tmp_path):
    """Exporters share equal initialisers through ``Identity`` nodes (a zero-initialised
    GPT-2's biases): a Gemm whose bias is ``Identity(DQ(int32 bias))`` of another Gemm, and one
    whose bias is ``Identity`` of a float initialiser, are int8 products like the first."""
    rng = np.random.default_rng(11)
    d = 32
    inits = {f"w{i}": M._he(rng, (d, d), d) for i in range(3)}
    inits["b0"] = (rng.standard_normal(d) * 0.1).astype(np.float32)
    inits["c"] = (rng.standard_normal(d) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["g0"]), helper.make_node("Relu", ["g0"], ["r0"]),
             helper.make_node("Identity", ["b0"], ["b1"]),
             helper.make_node("Gemm", ["r0", "w1", "b1"], ["g1"]), helper.make_node("Relu", ["g1"], ["r1"]),
             helper.make_node("Identity", ["c"], ["b2"]),
             helper.make_node("Gemm", ["r1", "w2", "b2"], ["y"])]
    fp32 = M._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, d])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, d])], inits, "shared_bias")
    q = M.quantize(fp32, tmp_path, "shared_bias")
    by_out = {o: n for n in q.graph.node for o in n.output}
    gemms = [n for n in q.graph.node if n.op_type == "Gemm"]
    bias_sources = [by_out[g.input[2]].op_type if g.input[2] in by_out else "initializer" for g in gemms]
    assert bias_sources.count("Identity") == 2, bias_sources    # the file still says what the test is about
    cm = fg.compile(q, CFG)
    check_ops(cm, 3)
    # three products quantised from 8 calibration inputs: onnxruntime's own error is ~7e-2
    compare(cm, q, fp32, max_steps=4, mean_steps=0.75, fp32_limit=1e-1)


@needs_int8_kernels
def test_int8_products_run_on_onednn_int8(conv_gemm, block):
    """Every QConv / QLinear of both models runs a oneDNN VNNI int8 implementation, listed in
    ``report.kernels``; the QConvs' activations are channels-last (oneDNN has no fast nchw
    int8 convolution)."""
    for _, q in (conv_gemm, block):
        cm = fg.compile(q, CFG)
        calls = int8_calls(cm)
        assert len(calls) == sum(1 for n in cm.graph.nodes if n.op_type in INT8_OPS) > 0
        for c in calls:
            if c.node.op_type == "QConv":
                assert c.node.outputs[0].layout == "nhwc", c.node.name


MAX_POOLS = {
    "3x3_s2": dict(kernel_shape=[3, 3], strides=[2, 2]),
    "pads": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "ceil": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "asymmetric_pads": dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 1, 1, 0]),
}


@needs_int8_kernels
@pytest.mark.parametrize("name", MAX_POOLS)
def test_uint8_max_pool_on_onednn(name, tmp_path):
    """A max pool between two int8 convolutions pools the uint8 values themselves on oneDNN's
    integer jit pooling (channels-last; not the portable kernel): the largest integer of a
    window is exact, so the outputs stay within the convolutions' own bound of onnxruntime."""
    rng = np.random.default_rng(5)
    inits = {"w0": M._he(rng, (16, 4, 3, 3), 36), "b0": (rng.standard_normal(16) * 0.1).astype(np.float32),
             "w1": M._he(rng, (8, 16, 3, 3), 144), "b1": (rng.standard_normal(8) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p"], **MAX_POOLS[name]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["y"], pads=[1, 1, 1, 1])]
    side = {"3x3_s2": 6, "pads": 7, "ceil": 7, "asymmetric_pads": 7}[name]
    fp32 = M._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 13, 13])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, side, side])], inits, "conv_pool")
    q = M.quantize(fp32, tmp_path, "conv_pool")
    cm = fg.compile(q, CFG)
    check_ops(cm, 2)
    pool = onednn_call(cm, "MaxPool")
    assert pool.node.inputs[0].dtype.name == "UINT8" and pool.node.inputs[0].layout == "nhwc"
    compare(cm, q, fp32, max_steps=1, mean_steps=0.25, fp32_limit=1e-1)


@needs_int8_kernels
def test_uint8_channel_shuffle_on_onednn(tmp_path):
    """ShuffleNet's Reshape-Transpose-Reshape between two int8 convolutions moves the uint8
    values themselves in one oneDNN reorder (not the portable kernel); a pure data movement."""
    rng = np.random.default_rng(6)
    g, c = 2, 8
    inits = {"w0": M._he(rng, (c, 4, 3, 3), 36), "b0": (rng.standard_normal(c) * 0.1).astype(np.float32),
             "w1": M._he(rng, (c, c, 3, 3), 9 * c), "b1": (rng.standard_normal(c) * 0.1).astype(np.float32),
             "split": np.array([1, g, c // g, 9, 9], np.int64), "merge": np.array([1, c, 9, 9], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Reshape", ["r0", "split"], ["s0"]),
             helper.make_node("Transpose", ["s0"], ["t0"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t0", "merge"], ["m0"]),
             helper.make_node("Conv", ["m0", "w1", "b1"], ["y"], pads=[1, 1, 1, 1])]
    fp32 = M._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 9, 9])], inits, "conv_shuffle")
    q = M.quantize(fp32, tmp_path, "conv_shuffle")
    cm = fg.compile(q, CFG)
    check_ops(cm, 2)
    assert onednn_call(cm, "ChannelShuffle").node.inputs[0].dtype.name == "UINT8"
    compare(cm, q, fp32, max_steps=1, mean_steps=0.25, fp32_limit=1e-1)


# ---------------------------------------------------------------- QOperator files

def test_qoperator_qlinearconv(tmp_path):
    """``quantize_static(QuantFormat.QOperator)`` on a conv-only model writes QuantizeLinear,
    QLinearConv and DequantizeLinear (standard ops): they run as QConvs, within one step of
    ``onnx.reference`` (the same single rounding; onnxruntime runs its own QLinearConv, whose
    sums saturate on a CPU without int8 dot products)."""
    fp32 = M.conv_only()
    q = M.quantize(fp32, tmp_path, "conv_only", "QOperator")
    ops = collections.Counter(n.op_type for n in q.graph.node)
    assert ops["QLinearConv"] == 3 and all(n.domain in ("", "ai.onnx") for n in q.graph.node), ops
    cm = fg.compile(q, CFG)
    check_ops(cm, 3)
    compare(cm, q, fp32, max_steps=1, mean_steps=0.25, oracle=M.exact_run)
    if available() and int8_exact():
        assert len(int8_calls(cm)) == 3


def _integer_model(op: str, seed=0):
    """``op`` (QLinearMatMul, ConvInteger or MatMulInteger) over a uint8 input with constant
    int8 weights and per-channel weight scales / zero points where the op allows them."""
    rng = np.random.default_rng(seed)
    if op == "ConvInteger":
        x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 7, 7])
        y = helper.make_tensor_value_info("y", TensorProto.INT32, [1, 6, 7, 7])
        inits = {"w": rng.integers(-120, 121, (6, 4, 3, 3), dtype=np.int8), "xz": np.array(121, np.uint8),
                 "wz": np.array(3, np.int8)}     # onnxruntime's ConvInteger: one weight zero point
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])
    elif op == "MatMulInteger":
        x = helper.make_tensor_value_info("x", TensorProto.UINT8, [3, 16])
        y = helper.make_tensor_value_info("y", TensorProto.INT32, [3, 8])
        inits = {"w": rng.integers(-120, 121, (16, 8), dtype=np.int8), "xz": np.array(130, np.uint8),
                 "wz": np.arange(-4, 4, dtype=np.int8)}
        node = helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"])
    else:
        x = helper.make_tensor_value_info("x", TensorProto.UINT8, [3, 16])
        y = helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 8])
        inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
                 "w": rng.integers(-127, 128, (16, 8), dtype=np.int8),
                 "ws": (rng.uniform(0.5, 1.5, 8) * 0.01).astype(np.float32), "wz": np.zeros(8, np.int8),
                 "ys": np.array(0.05, np.float32), "yz": np.array(120, np.uint8)}
        node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    g = helper.make_graph([node], op, [x], [y], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("op", ["QLinearMatMul", "ConvInteger", "MatMulInteger"])
def test_integer_ops(op):
    """QLinearMatMul (per-channel weight scales) becomes a QLinear within one step of
    ``onnx.reference``; ConvInteger / MatMulInteger (non-zero input and weight zero points, per
    output channel for MatMulInteger) become a QConv / QLinear with an int32 output equal to its
    (exact sums: onnxruntime's own kernels for these ops saturate on a CPU without int8 dot
    products)."""
    m = _integer_model(op)
    cm = fg.compile(m, CFG)
    check_ops(cm, 1)
    for seed in SEEDS:
        shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)}
        (y,) = cm.run(feeds).values()
        (ref,) = M.exact_run(m, feeds)
        y = np.asarray(y)
        assert y.dtype == ref.dtype
        diff = np.abs(y.astype(np.int64) - ref.astype(np.int64))
        if op == "QLinearMatMul":
            assert diff.max() <= 1 and diff.mean() < 0.2, (diff.max(), diff.mean())
        else:
            assert diff.max() == 0, diff.max()
    if available() and int8_exact():
        assert len(int8_calls(cm)) == 1


def test_com_microsoft_qoperator_refused(tmp_path):
    """QOperator format on the conv net writes com.microsoft QLinearAdd /
    QLinearGlobalAveragePool / QGemm: refused at import, naming them and saying to
    re-quantise as QDQ."""
    q = M.quantize(M.conv_net(head="Gemm"), tmp_path, "conv_qop", "QOperator")
    ms = {n.op_type for n in q.graph.node if n.domain == "com.microsoft"}
    assert {"QGemm", "QLinearAdd"} <= ms, ms
    with pytest.raises(UnsupportedOpError) as err:
        fg.compile(q, CFG)
    msg = str(err.value)
    assert "QDQ" in msg and "re-quantise" in msg and "QGemm" in msg and "QLinearAdd" in msg, msg
    assert err.value.op_type in ms


# ---------------------------------------------------------------- .fgm

def test_fgm_round_trip(conv_gemm, block, attention, tmp_path, monkeypatch):
    """Saved and loaded: the same ops, the same outputs bit for bit; loading runs no pass and
    (where the int8 kernels run) repacks no weight."""
    from fusegraph.passes import manager
    for name, (fp32, q) in (("conv", conv_gemm), ("block", block), ("attention", attention)):
        cm = fg.compile(q, CFG)
        path = tmp_path / f"{name}.fgm"
        cm.save(path)
        with monkeypatch.context() as mp:
            mp.setattr(manager.PassManager, "run", lambda *a, **k: pytest.fail("a pass ran on load"))
            loaded = fg.load(path, threads=2)
            if available() and int8_exact():     # the packed int8 weights were stored as oneDNN wants them
                assert loaded.load_info["weight_reorders"] == 0, loaded.load_info
            assert collections.Counter(n.op_type for n in loaded.graph.nodes) == \
                collections.Counter(n.op_type for n in cm.graph.nodes)
            for seed in SEEDS:
                feeds = M.feeds_for(fp32, seed)
                (a,) = cm.run(feeds).values()
                (b,) = loaded.run(feeds).values()
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kernels", ["int8", "float"])
@pytest.mark.parametrize("form", ["qdq", "qlinear"])
@pytest.mark.parametrize("a_type,b_type", [(TensorProto.UINT8, TensorProto.UINT8), (TensorProto.INT8, TensorProto.INT8),
                                           (TensorProto.UINT8, TensorProto.INT8), (TensorProto.INT8, TensorProto.UINT8)])
def test_qmatmul_types_within_one_step_of_the_reference(a_type, b_type, form, kernels, monkeypatch):
    """Q(DQ(a) @ DQ(b)) of two quantised graph inputs (or ONNX's QLinearMatMul of them), each
    8-bit type on either side: one ``QMatMul`` on oneDNN's int8 matmul (a uint8 ``b`` moved
    into int8 with its zero point) where this CPU sums int8 exactly, or on its float32 form
    (``kernels``: both operands dequantised by reorders, a float32 matmul, the output
    quantised by a reorder), within one step of ``onnx.reference``."""
    from onnx.reference import ReferenceEvaluator
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatForm
    M.int8_form(monkeypatch, kernels)
    np_of = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
    zero = {TensorProto.UINT8: 131, TensorProto.INT8: -3}
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "sa"), numpy_helper.from_array(np.array(0.04, np.float32), "sb"),
             numpy_helper.from_array(np.array(0.3, np.float32), "sy"),
             numpy_helper.from_array(np.array(zero[a_type], np_of[a_type]), "za"),
             numpy_helper.from_array(np.array(zero[b_type], np_of[b_type]), "zb"),
             numpy_helper.from_array(np.array(zero[a_type], np_of[a_type]), "zy")]
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["qa"]),
             helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["qb"])]
    if form == "qdq":
        nodes += [helper.make_node("DequantizeLinear", ["qa", "sa", "za"], ["da"]),
                  helper.make_node("DequantizeLinear", ["qb", "sb", "zb"], ["db"]),
                  helper.make_node("MatMul", ["da", "db"], ["m"]), helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"])]
    else:
        nodes.append(helper.make_node("QLinearMatMul", ["qa", "sa", "za", "qb", "sb", "zb", "sy", "zy"], ["y"]))
    graph = helper.make_graph(nodes, "qmatmul", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 5, 24]),
                                                 helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 2, 24, 7])],
                              [helper.make_tensor_value_info("y", a_type, [1, 2, 5, 7])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    rng = np.random.default_rng(7)
    feeds = {"a": (rng.standard_normal((1, 2, 5, 24)) * 2).astype(np.float32),
             "b": (rng.standard_normal((1, 2, 24, 7)) * 2).astype(np.float32)}
    cm = fg.compile(model, CFG)
    (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == "QMatMul"]
    if kernels == "int8":
        assert M.int8_dot_products(getattr(call.kernel, "kernel", call.kernel).impl)
    else:
        assert isinstance(call.kernel, FloatForm) and not call.kernel.impl.startswith("ref"), call.kernel
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    got = cm.run(feeds)["y"]
    assert got.dtype == want.dtype
    steps = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert steps.max() <= 1 and steps.mean() < 0.05, (steps.max(), steps.mean())


# ---------------------------------------------------------------- a fused Relu's NaN

def test_fused_relu_is_onednn_relu_only_where_nan_cannot_reach_it():
    """oneDNN's relu maps NaN to 0; ``elu`` with alpha 0 keeps it (and costs an exponential
    per value). The int8 epilogue's inputs are integers: NaN can come only from a constant
    (a scale, the bias) or an overflow, which the bind-time bound rules out."""
    from fusegraph.runtime.backends.cpu.dnnl.int8_support import relu_post_op
    ws, bias = torch.full((8,), 2e-3), torch.randn(8)
    assert relu_post_op(576, 0.02, ws, bias)[1] == "relu"
    assert relu_post_op(576, 0.02, ws, None, z_scale=0.05)[1] == "relu"
    for bad in (float("nan"), float("inf"), -float("inf")):
        b = bias.clone()
        b[3] = bad
        assert relu_post_op(576, 0.02, ws, b)[1] == "elu", bad
        w = ws.clone()
        w[1] = bad
        assert relu_post_op(576, 0.02, w, bias)[1] == "elu", bad
        assert relu_post_op(576, bad, ws, bias)[1] == "elu", bad
        assert relu_post_op(576, 0.02, ws, bias, z_scale=bad)[1] == "elu", bad
    # finite constants whose sums can reach float32's range: an infinity minus another is NaN
    assert relu_post_op(576, 1e34, ws, bias)[1] == "elu"
    assert relu_post_op(576, 0.02, ws, torch.full((8,), 3e38))[1] == "elu"


def _conv_relu_model(bias: np.ndarray, y_zero: int) -> onnx.ModelProto:
    """DQ(x), DQ(w), Conv with a float bias, Relu, Q to uint8 with zero point ``y_zero``: one
    QConv whose Relu is fused (a non-zero output zero point keeps it from being the clamp)."""
    rng = np.random.default_rng(0)
    c = bias.size
    inits = {"w": rng.integers(-100, 100, size=(c, c, 3, 3), dtype=np.int8), "ws": np.full(c, 2e-3, np.float32),
             "wz": np.zeros(c, np.int8), "xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "ys": np.array(0.05, np.float32), "yz": np.array(y_zero, np.uint8), "b": bias}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["cv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["cv"], ["r"]), helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "conv_relu", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, c, 8, 8])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


@needs_int8_kernels
@pytest.mark.parametrize("bad", [None, np.nan])
def test_fused_relu_of_an_int8_conv(bad, monkeypatch):
    """A QConv's fused Relu runs oneDNN's relu when its bias is finite and ``elu`` where a NaN
    bias makes NaN: bit for bit onnxruntime ORT_DISABLE_ALL and the op's own (reference)
    kernel either way, the NaN channel included (relu would quantise it to the zero point)."""
    import fusegraph.runtime.backends.cpu.dnnl.conv_int8 as conv_int8
    chosen = []
    real = conv_int8.relu_post_op
    monkeypatch.setattr(conv_int8, "relu_post_op", lambda *a, **k: chosen.append(real(*a, **k)) or chosen[-1])
    bias = (np.random.default_rng(1).standard_normal(16) * 0.1).astype(np.float32)
    if bad is not None:
        bias[3], bias[5], bias[7] = bad, np.inf, -np.inf
    m = _conv_relu_model(bias, y_zero=3)
    feeds = {"x": np.random.default_rng(2).integers(0, 256, (1, 16, 8, 8), dtype=np.uint8)}
    cm = fg.compile(m, CFG)
    onednn_call(cm, "QConv")
    assert [op[1] for op in chosen] == ["elu" if bad is not None else "relu"]
    got = cm.run(feeds)["y"]
    (ref,) = M.ort_run(m, feeds)
    own = fg.compile(m, fg.Config(threads=2, cpu_kernels="portable")).run(feeds)["y"]
    assert np.array_equal(got, ref) and np.array_equal(got, own)
    if bad is not None:
        assert (got[0, 3] == 0).all() and (got[0, 5] == 255).all() and (got[0, 7] == 3).all()


# ---------------------------------------------------------------- a product read through a DQ

def _gemm_dq_model(view: bool, bias: np.ndarray | None = None, y_type=TensorProto.UINT8, y_zero=120) -> onnx.ModelProto:
    """DQ(x) -> Gemm(DQ(w), b) -> Q [-> Reshape] -> DQ -> y: a product whose quantised output
    a float consumer (here the graph output) reads through its DequantizeLinear."""
    rng = np.random.default_rng(4)
    zero = np.array(y_zero, np.uint8 if y_type == TensorProto.UINT8 else np.int8)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": rng.integers(-127, 128, (16, 8), dtype=np.int8), "ws": (rng.uniform(0.5, 1.5, 8) * 0.01).astype(np.float32),
             "wz": np.zeros(8, np.int8), "b": bias if bias is not None else rng.standard_normal(8).astype(np.float32),
             "ys": np.array(0.05, np.float32), "yz": zero, "shape": np.array([2, 16], np.int64)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("Gemm", ["xd", "wd", "b"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "ys", "yz"], ["q"])]
    if view:
        nodes.append(helper.make_node("Reshape", ["q", "shape"], ["qv"]))
    nodes.append(helper.make_node("DequantizeLinear", ["qv" if view else "q", "ys", "yz"], ["y"]))
    g = helper.make_graph(nodes, "gemm_dq", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16] if view else [4, 8])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("y_type,y_zero", [(TensorProto.UINT8, 120), (TensorProto.INT8, -3)])
def test_product_read_through_a_dequantize_writes_float_on_its_grid(view, y_type, y_zero):
    """``qdq_grid_output``: the QLinear writes float32 on its output's quantisation grid (the
    DequantizeLinear, and the Reshape's uint8 copy, are gone): every value is ``(q - zp) *
    scale`` for a q of the grid's type, within one step of onnxruntime ORT_DISABLE_ALL on the
    same file, on oneDNN's int8 kernel where this CPU has one."""
    m = _gemm_dq_model(view, y_type=y_type, y_zero=y_zero)
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QLinear"] == 1 and not ops["DequantizeLinear"] and not ops["QuantizeLinear"], ops
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    assert int(p.attrs["y_grid"]) == int(fg.ir.DType.UINT8 if y_type == TensorProto.UINT8 else fg.ir.DType.INT8)
    if M.int8_kernels_exact():
        onednn_call(cm, "QLinear")
    lo, hi = (0, 255) if y_type == TensorProto.UINT8 else (-128, 127)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        y = cm.run(feeds)["y"]
        (ref,) = M.ort_run(m, feeds)
        k = np.round(y.astype(np.float64) / np.float32(0.05))         # q - zp
        assert np.array_equal(y, k.astype(np.float32) * np.float32(0.05))
        assert (k + y_zero).min() >= lo and (k + y_zero).max() <= hi
        assert y.shape == ref.shape and np.abs(y.astype(np.float64) - ref).max() <= 0.05 * 1.001


def test_product_grid_declines_where_its_epilogue_could_hold_nan():
    """A NaN bias: the grid's post-ops would carry NaN where the reference quantises it; the
    int8 kernel declines and the reference form runs, as onnxruntime computes it."""
    bias = np.random.default_rng(5).standard_normal(8).astype(np.float32)
    bias[2] = np.nan
    _declines_to_the_reference(_gemm_dq_model(False, bias), "y_grid", (4, 16), 0.05)


def _declines_to_the_reference(m: onnx.ModelProto, attr: str, x_shape, step: float) -> None:
    """``m``'s QLinear carries ``attr`` (the fusion happened), its int8 kernel declines naming
    the grid and NaN, and the outputs are onnxruntime ORT_DISABLE_ALL's within one ``step``
    where they are finite."""
    cm = fg.compile(m, CFG)
    assert any(n.op_type == "QLinear" and n.attrs.get(attr) for n in cm.graph.nodes)
    if M.int8_kernels_exact():
        declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
        assert any("grid" in r and "NaN" in r for r in declined.values()), declined
    feeds = {"x": np.random.default_rng(0).integers(0, 256, x_shape, dtype=np.uint8)}
    y = cm.run(feeds)["y"]
    (ref,) = M.ort_run(m, feeds)
    finite = np.isfinite(ref)
    assert np.abs(y[finite].astype(np.float64) - ref[finite]).max() <= step * 1.001


@pytest.mark.parametrize("bad", [7, int(fg.ir.DType.UINT8)])
def test_a_grid_the_op_cannot_have_is_refused(bad):
    """``y_grid`` naming no 8-bit type, or on an output that is not float32 (as a re-sealed
    artifact could say): refused with the reason, never ignored."""
    from fusegraph.ir import DType, Graph
    g = Graph("grid")
    x = g.add_input("x", DType.UINT8, (4, 16))
    w = g.add_constant("w", torch.ones(16, 8, dtype=torch.int8))
    ws = g.add_constant("ws", torch.full((8,), 0.01))
    y_type = int(DType.FLOAT) if bad == 7 else int(DType.UINT8)
    n = g.add_node("QLinear", [x, w, ws], outputs=1, domain="fusegraph", version=1,
                   attrs={"x_scale": 0.02, "x_zero_point": 128, "y_scale": 0.05, "y_zero_point": 3,
                          "y_type": y_type, "y_grid": bad})
    n.outputs[0].dtype, n.outputs[0].shape = DType(y_type), (4, 8)
    g.outputs.append(n.outputs[0])
    with pytest.raises(fg.errors.FusegraphError, match="y_grid"):
        fg.compile(g, CFG).run({"x": np.zeros((4, 16), np.uint8)})


def test_scores_read_through_a_dequantize_are_written_on_their_grid():
    """``Softmax(DQ(Q(DQ(a) @ DQ(b))))``: the QMatMul writes its scores as float32 on their
    grid (no DequantizeLinear left), on oneDNN's int8 matmul where this CPU has one; the
    softmax of them as onnxruntime ORT_DISABLE_ALL computes it on the same file."""
    inits = {"as": np.array(0.03, np.float32), "az": np.array(120, np.uint8), "bs": np.array(0.02, np.float32),
             "bz": np.array(130, np.uint8), "ys": np.array(0.1, np.float32), "yz": np.array(128, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["a", "as", "az"], ["ad"]),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"]),
             helper.make_node("MatMul", ["ad", "bd"], ["s"]), helper.make_node("QuantizeLinear", ["s", "ys", "yz"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "ys", "yz"], ["sd"]), helper.make_node("Softmax", ["sd"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 16, 32]),
                                            helper.make_tensor_value_info("b", TensorProto.UINT8, [2, 32, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 16])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QMatMul"] == 1 and not ops["DequantizeLinear"] and not ops["QuantizeLinear"], ops
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QMatMul"]
    assert int(p.attrs["y_grid"]) == int(fg.ir.DType.UINT8)
    if M.int8_kernels_exact():       # (a uint8 second operand: moved into int8 before oneDNN's matmul)
        (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == "QMatMul"]
        assert M.int8_dot_products(getattr(call.kernel, "kernel", call.kernel).impl)
    for seed in range(3):
        r = np.random.default_rng(seed)
        feeds = {"a": r.integers(0, 256, (2, 16, 32), dtype=np.uint8), "b": r.integers(0, 256, (2, 32, 16), dtype=np.uint8)}
        np.testing.assert_allclose(cm.run(feeds)["y"], M.ort_run(m, feeds)[0], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- a product, its GELU, a Q

def _gemm_gelu_model(form: str, bias: np.ndarray | None = None) -> onnx.ModelProto:
    """DQ(x) -> Gemm(DQ(w), b) -> Q -> DQ -> GELU -> Q -> DQ -> y: a transformer's first FFN
    product as a QDQ file has it (``form``: "erf", the exporters' decomposition; "none" /
    "tanh", opset 20's Gelu; "views": that Gelu between two reshapes)."""
    rng = np.random.default_rng(6)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": rng.integers(-127, 128, (32, 24), dtype=np.int8),
             "ws": (rng.uniform(0.5, 1.5, 24) * 0.004).astype(np.float32), "wz": np.zeros(24, np.int8),
             "b": bias if bias is not None else (rng.standard_normal(24) * 0.3).astype(np.float32),
             "s1": np.array(0.011, np.float32), "z1": np.array(131, np.uint8),
             "s2": np.array(0.007, np.float32), "z2": np.array(20, np.uint8),
             "sq2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("Gemm", ["xd", "wd", "b"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"])]
    if form == "views":         # reshapes on both sides of the GELU, as GPT-2's file has them
        nodes += [helper.make_node("Reshape", ["d1", "flat"], ["d1v"]),
                  helper.make_node("Gelu", ["d1v"], ["av"]), helper.make_node("Reshape", ["av", "back"], ["a"])]
        inits.update(flat=np.array([384], np.int64), back=np.array([16, 24], np.int64))
    elif form == "erf":
        nodes += [helper.make_node("Div", ["d1", "sq2"], ["e0"]), helper.make_node("Erf", ["e0"], ["e1"]),
                  helper.make_node("Add", ["e1", "one"], ["e2"]), helper.make_node("Mul", ["d1", "e2"], ["e3"]),
                  helper.make_node("Mul", ["e3", "half"], ["a"])]
    else:
        nodes.append(helper.make_node("Gelu", ["d1"], ["a"], approximate=form))
    nodes += [helper.make_node("QuantizeLinear", ["a", "s2", "z2"], ["q2"]),
              helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["y"])]
    g = helper.make_graph(nodes, "gemm_gelu", [helper.make_tensor_value_info("x", TensorProto.UINT8, [16, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 24])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("form", ["erf", "none", "tanh", "views"])
def test_a_product_s_gelu_and_its_quantisation_run_in_its_epilogue(form):
    """``qdq_grid_gelu``: the product, its grid, the GELU and the QuantizeLinear are one
    QLinear (``mid_activation``; no Gelu, no Q / DQ left), on oneDNN's int8 kernel where
    this CPU has one, within one step of onnxruntime ORT_DISABLE_ALL on the same file, and
    mostly equal to it."""
    m = _gemm_gelu_model(form)
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QLinear"] == 1 and not ops["Gelu"] and not ops["Erf"] and not ops["QuantizeLinear"], ops
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    assert p.attrs["mid_activation"] == ("gelu_tanh" if form == "tanh" else "gelu")
    # the last DequantizeLinear is gone too: the product writes float32 on the Q's grid
    assert int(p.attrs["mid_grid"]) == int(fg.ir.DType.UINT8) and int(p.attrs["y_grid"]) == int(fg.ir.DType.UINT8)
    if M.int8_kernels_exact():
        onednn_call(cm, "QLinear")
    unequal = 0
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (16, 32), dtype=np.uint8)}
        y = cm.run(feeds)["y"]
        (ref,) = M.ort_run(m, feeds)
        steps = np.abs(y.astype(np.float64) - ref) / np.float32(0.007)
        assert steps.max() <= 1.001, steps.max()
        unequal += int((steps > 0.5).sum())
        k = np.round(y.astype(np.float64) / np.float32(0.007)) + 20          # q, on uint8's grid
        assert k.min() >= 0 and k.max() <= 255
    assert unequal <= 4, unequal          # a tie may round the other way; no more


def test_a_product_gelu_with_a_nan_bias_declines_to_the_reference():
    """A NaN bias: the epilogue could carry NaN, which its post-ops would not quantise as
    QuantizeLinear does; the int8 kernel declines (naming the grid) and the reference form
    computes what onnxruntime does."""
    bias = (np.random.default_rng(7).standard_normal(24) * 0.3).astype(np.float32)
    bias[5] = np.nan
    _declines_to_the_reference(_gemm_gelu_model("none", bias), "mid_activation", (16, 32), 0.007)


@pytest.mark.parametrize("op,attrs", [
    ("QLinear", {"mid_activation": "relu", "mid_grid": 2, "mid_scale": 0.01}),
    ("QLinear", {"mid_activation": "gelu", "mid_grid": 7, "mid_scale": 0.01}),
    ("QLinear", {"mid_activation": "gelu", "mid_grid": 2, "mid_scale": -1.0}),
    ("QLinear", {"mid_grid": 2, "mid_scale": 0.01}),
    ("QLinear", {"mid_activation": "gelu", "mid_grid": 2, "mid_scale": 0.01, "activation": "relu"}),
    ("QConv", {"mid_activation": "gelu", "mid_grid": 2, "mid_scale": 0.01}),
])
def test_mid_attributes_the_op_cannot_have_are_refused(op, attrs):
    """``mid_*`` that name no GELU or no 8-bit grid, come without their activation, sit beside a
    Relu, or sit on a QConv (as a re-sealed artifact could say): refused, never ignored."""
    from fusegraph.ir import DType, Graph
    g = Graph("mid")
    if op == "QLinear":
        x = g.add_input("x", DType.UINT8, (4, 16))
        w = g.add_constant("w", torch.ones(16, 8, dtype=torch.int8))
        shape = (4, 8)
    else:
        x = g.add_input("x", DType.UINT8, (1, 16, 4, 4))
        w = g.add_constant("w", torch.ones(8, 16, 1, 1, dtype=torch.int8))
        shape = (1, 8, 4, 4)
    ws = g.add_constant("ws", torch.full((8,), 0.01))
    n = g.add_node(op, [x, w, ws], outputs=1, domain="fusegraph", version=1,
                   attrs={"x_scale": 0.02, "x_zero_point": 128, "y_scale": 0.05, "y_zero_point": 3,
                          "y_type": int(DType.UINT8), **attrs})
    n.outputs[0].dtype, n.outputs[0].shape = DType.UINT8, shape
    g.outputs.append(n.outputs[0])
    with pytest.raises(fg.errors.FusegraphError, match="mid_"):
        fg.compile(g, CFG).run({"x": np.zeros(tuple(x.shape), np.uint8)})


def _split_model(trans_b: bool = False, bias: bool = False) -> onnx.ModelProto:
    """DQ(x) -> Gemm(DQ(w)[, b]) -> Q -> DQ -> Split in three -> q * c, k * c, v -> each Q ->
    DQ: a GPT-2 attention's packed q / k / v product, split and scaled before the scores (its
    weight [K, N], or [N, K] under ``trans_b``)."""
    rng = np.random.default_rng(8)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": rng.integers(-127, 128, (24, 16) if trans_b else (16, 24), dtype=np.int8),
             "ws": (rng.uniform(0.5, 1.5, 24) * 0.01).astype(np.float32), "wz": np.zeros(24, np.int8),
             "s1": np.array(0.05, np.float32), "z1": np.array(120, np.uint8), "c": np.array(0.35355339, np.float32),
             "sq": np.array(0.02, np.float32), "zq": np.array(125, np.uint8),
             "sv": np.array(0.07, np.float32), "zv": np.array(118, np.uint8), "parts": np.array([8, 8, 8], np.int64)}
    if bias:
        inits["bias"] = rng.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if trans_b else 1),
             helper.make_node("Gemm", ["xd", "wd"] + (["bias"] if bias else []), ["g"], transB=int(trans_b)),
             helper.make_node("QuantizeLinear", ["g", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("Split", ["d1", "parts"], ["a", "b", "vs"], axis=1),
             helper.make_node("Mul", ["a", "c"], ["ac"]), helper.make_node("Mul", ["b", "c"], ["bc"])]
    outs = []
    for name, src, s, z in (("q", "ac", "sq", "zq"), ("k", "bc", "sq", "zq"), ("v", "vs", "sv", "zv")):
        nodes += [helper.make_node("QuantizeLinear", [src, s, z], [f"{name}q"]),
                  helper.make_node("DequantizeLinear", [f"{name}q", s, z], [name])]
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, 8]))
    g = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 16])], outs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("trans_b,bias", [(False, False), (True, True)])
def test_a_split_of_a_quantised_product_is_one_product_per_part(trans_b, bias):
    """A Split of a quantised product along its columns (GPT-2's q / k / v): ``dq_sink`` moves
    the DequantizeLinear past the Split, ``split_product`` makes one QLinear per part (the
    weight's columns, their scales), and each part's scaling and new quantisation folds into
    its product (``requantize_product``, clamped to the product's own range where the new one
    is wider): no Split, no Mul, no Requantize; within one step of onnxruntime ORT_DISABLE_ALL
    at each output (``rounding_bound`` is 1 for these scales), the weight given either way
    round, with a bias (sliced with the columns) or without."""
    m = _split_model(trans_b, bias)
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert not ops["Split"] and not ops["Mul"] and not ops["Requantize"] and ops["QLinear"] == 3, ops
    assert rounding_bound(0.05 * 0.35355339, 0.02) == 1 and rounding_bound(0.05, 0.07) == 1
    if M.int8_kernels_exact():
        from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
        kernels = [getattr(c.kernel, "fast", c.kernel) for c in cm._executor.binding.calls if c.node.op_type == "QLinear"]
        assert len(kernels) == 3 and all(isinstance(k, DnnlKernel) for k in kernels), cm.report.kernels["declined"]
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        got = cm.run(feeds)
        refs = M.ort_run(m, feeds)
        for (name, y), ref, step in zip(got.items(), refs, (0.02, 0.02, 0.07)):
            assert np.abs(y.astype(np.float64) - ref).max() <= step * 1.001, name


def _quantised_gemm(seed: int) -> tuple[dict, list]:
    """(initialisers, nodes) of ``g = Gemm(DQ(x), DQ(w))`` as a QDQ file writes it: ``x``
    uint8 [4, 16] (scale 0.02, zero point 128), ``w`` int8 [16, 24] per column."""
    rng = np.random.default_rng(seed)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": rng.integers(-127, 128, (16, 24), dtype=np.int8),
             "ws": (rng.uniform(0.5, 1.5, 24) * 0.01).astype(np.float32), "wz": np.zeros(24, np.int8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("Gemm", ["xd", "wd"], ["g"])]
    return inits, nodes


def _heads_model(c: float, bias: float, s2: float | None = None) -> onnx.ModelProto:
    """A query projection as a QDQ transformer writes it: DQ(x) -> Gemm(DQ(w)) -> Q1 -> DQ1 ->
    Add(bias, zero in a freshly initialised model) -> Reshape into heads -> Transpose -> Mul(c)
    -> Q2 -> DQ2 -> y. Q2's range (scale ``s2``, zero point 125) is within ``c`` times Q1's
    unless ``s2`` is given larger, as calibration makes it."""
    s2 = 0.02 * abs(c) if s2 is None else s2
    inits, nodes = _quantised_gemm(9)
    inits.update({"s1": np.array(0.05, np.float32), "z1": np.array(120, np.uint8), "b": np.full(24, bias, np.float32),
                  "shape": np.array([4, 3, 8], np.int64), "c": np.array(c, np.float32),
                  "s2": np.array(s2, np.float32), "z2": np.array(125, np.uint8)})
    nodes += [helper.make_node("QuantizeLinear", ["g", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("Add", ["d1", "b"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Mul", ["t", "c"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s2", "z2"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["y"])]
    g = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 8])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("c,wide", [(0.125, False), (0.35355339, False), (0.125, True)])
def test_a_query_split_into_heads_and_scaled_is_quantised_by_its_product(c, wide):
    """Once the zero bias is gone, the product's DequantizeLinear sinks through the reshape and
    transpose (they move uint8), and the scaled requantisation folds into the product
    (``requantize_product`` through the moves, its scale ``s2 / c``): no float32 between the
    product and the next quantised op, no Mul, no Requantize; within ``rounding_bound(c s1,
    s2)`` steps of onnxruntime ORT_DISABLE_ALL (the product rounds once where the file rounds
    twice), saturated values included: where the second range, over ``c``, reaches beyond
    the first (``wide``), the product clamps to the first range (``y_clip``) as the file's
    first quantisation does, on oneDNN's int8 kernel where this CPU has one."""
    s2 = 0.03 if wide else 0.02 * c
    m = _heads_model(c, 0.0, s2)
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QLinear"] == 1 and not ops["Mul"] and not ops["Requantize"] and not ops["QuantizeLinear"], ops
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    (t,) = [n for n in cm.graph.nodes if n.op_type == "Transpose"]
    assert t.inputs[0].dtype == fg.ir.DType.UINT8
    assert p.attrs["y_scale"] == pytest.approx(s2 / c, rel=1e-6) and int(p.attrs["y_zero_point"]) == 125
    assert ("y_clip" in p.attrs) == wide
    if wide:
        assert p.attrs["y_clip"] == pytest.approx([0.05 * (0 - 120), 0.05 * (255 - 120)], rel=1e-6)
    if M.int8_kernels_exact():
        onednn_call(cm, "QLinear")
    bound = rounding_bound(0.05 * c, s2)
    steps = []
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        (ref,) = M.ort_run(m, feeds)
        k = np.abs(cm.run(feeds)["y"].astype(np.float64) - ref) / np.float32(s2)
        steps.append(k)
        assert k.max() <= bound + 1e-3
    assert np.mean(np.concatenate([s.ravel() for s in steps]) > 0.5) < 0.5       # most values agree


def test_the_reference_form_clamps_a_product_as_the_model_did(monkeypatch):
    """The op's own kernel (what runs where the int8 kernel declines) clamps to ``y_clip``
    before quantising: a QLinear whose range was widened for the next quantisation keeps the
    model's first clamp (within the rounding bound of onnxruntime ORT_DISABLE_ALL everywhere,
    the clamped values included); a re-sealed ``y_clip`` that is not a finite range, or a
    ``conv_clip`` on a product that is not a convolution, is refused by the op with the reason."""
    from fusegraph.ops import quantized
    M.int8_form(monkeypatch, "reference")
    c, s2 = 0.125, 0.03
    m = _heads_model(c, 0.0, s2)
    cm = fg.compile(m, CFG)
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    assert "y_clip" in p.attrs
    assert any(d["node"] == p.name for d in cm.report.kernels["declined"])
    bound = rounding_bound(0.05 * c, s2)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        (ref,) = M.ort_run(m, feeds)
        assert (np.abs(cm.run(feeds)["y"].astype(np.float64) - ref) / np.float32(s2)).max() <= bound + 1e-3
    from fusegraph.ops.registry import NodeContext
    for key, bad in [("y_clip", v) for v in ([1.0], [2.0, 1.0], [0.0, float("inf")], "ab")] + [("conv_clip", [0.0, 1.0])]:
        node = fg.ir.Node("QLinear", list(p.inputs), [fg.ir.Value("y", fg.ir.DType.UINT8, None)],
                          {**p.attrs, key: bad}, name="bad", domain="fusegraph")
        with pytest.raises(UnsupportedOpError, match=key):      # (a QLinear has no conv_clip)
            quantized._qlinear(NodeContext(node))


@pytest.mark.parametrize("c,bias", [(-0.5, 0.0), (0.125, 0.25)])
def test_a_scaled_query_the_product_cannot_take_keeps_its_requantisation(c, bias):
    """A negative scale (it would reverse the grid) or a bias between the product and the
    reshape leaves the requantisation where it is: within one step of onnxruntime
    ORT_DISABLE_ALL."""
    m = _heads_model(c, bias)
    step = float(numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "s2")))
    cm = fg.compile(m, CFG)
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    assert p.attrs.get("y_scale") != pytest.approx(step / abs(c), rel=1e-6)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        (ref,) = M.ort_run(m, feeds)
        assert np.abs(cm.run(feeds)["y"].astype(np.float64) - ref).max() <= step * 1.001


def _bias_model(s2: float, bias_spread: float) -> onnx.ModelProto:
    """A product and its bias as a QDQ file writes them when the bias stays float: DQ(x) ->
    Gemm(DQ(w)) -> Q1 -> DQ1 -> Add(b) -> Q2 -> y (uint8), Q1's range [-2.56, 2.54] narrower
    than the product's values for full-range inputs, the bias spread over ``+-bias_spread``."""
    inits, nodes = _quantised_gemm(12)
    inits.update({"s1": np.array(0.02, np.float32), "z1": np.array(128, np.uint8),
                  "b": np.linspace(-bias_spread, bias_spread, 24).astype(np.float32),
                  "s2": np.array(s2, np.float32), "z2": np.array(128, np.uint8)})
    nodes += [helper.make_node("QuantizeLinear", ["g", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("Add", ["d1", "b"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "s2", "z2"], ["y"])]
    g = helper.make_graph(nodes, "bias", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 24])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("wide,form", [(False, "int8"), (False, "float"), (True, "int8"), (True, "float"),
                                       (True, "reference")])
def test_a_bias_folds_into_its_product_after_the_first_clamp(wide, form, monkeypatch):
    """``qdq_bias`` folds ``Q2(DQ1(Q1(product)) + b)`` into the product: where Q2 saturates
    wherever Q1 clamps, in every column (Q2's range, less the column's bias, within Q1's), the
    bias joins the product's own; where Q2's range reaches beyond (``wide``), the product
    clamps its result to Q1's range (``y_clip``) and adds the bias after the clamp
    (``post_bias``: oneDNN's clip, then a binary add, or the op's own kernel where the int8
    kernel declines; ``form``: ``M.int8_form``), as the model adds it to the clamped values. Every
    output within ``rounding_bound`` of onnxruntime ORT_DISABLE_ALL, with full-range inputs that
    Q1 clamps."""
    M.int8_form(monkeypatch, form)
    s2 = 0.05 if wide else 0.009
    spread = 1.0 if wide else 0.2
    m = _bias_model(s2, spread)
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    assert len(ops) == 1 and float(p.attrs["y_scale"]) == pytest.approx(s2, rel=1e-6), ops
    if wide:
        assert len(p.inputs) == 3 and p.attrs["y_clip"] == pytest.approx([0.02 * -128, 0.02 * 127], rel=1e-6)
        assert p.attrs["post_bias"] == pytest.approx(np.linspace(-spread, spread, 24), rel=1e-6)
    else:
        assert len(p.inputs) == 4 and "y_clip" not in p.attrs and "post_bias" not in p.attrs
    if form != "reference":
        onednn_call(cm, "QLinear")
    bound = rounding_bound(0.02, s2)
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    clamped = 0
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        (ref,) = M.ort_run(m, feeds)
        y = cm.run(feeds)["y"]
        assert y.dtype == np.uint8 and np.abs(y.astype(np.int64) - ref.astype(np.int64)).max() <= bound
        v = ((feeds["x"].astype(np.float64) - 128) * 0.02) @ (init["w"].astype(np.float64) * init["ws"])
        clamped += int((np.abs(v) > 2.6).sum())
    assert clamped > 0            # Q1's clamp was reached


def test_a_product_with_a_bias_after_its_clamp_splits_with_its_columns():
    """``split_product`` on a product whose bias comes after its clamp (``post_bias``): each
    part keeps its columns' bias, so every output stays within ``rounding_bound`` of
    onnxruntime ORT_DISABLE_ALL, clamped values included."""
    inits, nodes = _quantised_gemm(12)
    inits.update({"s1": np.array(0.02, np.float32), "z1": np.array(128, np.uint8),
                  "b": np.linspace(-1.0, 1.0, 24).astype(np.float32),
                  "s2": np.array(0.05, np.float32), "z2": np.array(128, np.uint8),
                  "parts": np.array([8, 8, 8], np.int64)})
    nodes += [helper.make_node("QuantizeLinear", ["g", "s1", "z1"], ["q1"]),
              helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
              helper.make_node("Add", ["d1", "b"], ["a"]),
              helper.make_node("QuantizeLinear", ["a", "s2", "z2"], ["q2"]),
              helper.make_node("Split", ["q2", "parts"], ["p0", "p1", "p2"], axis=1)]
    outs = []
    for k in range(3):
        nodes.append(helper.make_node("DequantizeLinear", [f"p{k}", "s2", "z2"], [f"y{k}"]))
        outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [4, 8]))
    g = helper.make_graph(nodes, "bias_split", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 16])],
                          outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    cm = fg.compile(m, CFG)
    parts = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    assert len(parts) == 3 and not any(n.op_type == "Split" for n in cm.graph.nodes)
    got = sorted(tuple(n.attrs["post_bias"]) for n in parts)
    want = sorted(tuple(c) for c in np.linspace(-1.0, 1.0, 24).astype(np.float32).reshape(3, 8).tolist())
    assert np.allclose(got, want)
    bound = rounding_bound(0.02, 0.05)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (4, 16), dtype=np.uint8)}
        refs = M.ort_run(m, feeds)
        ys = cm.run(feeds)
        for k, ref in enumerate(refs):
            assert (np.abs(ys[f"y{k}"].astype(np.float64) - ref) / np.float32(0.05)).max() <= bound + 1e-3


def test_a_bias_after_the_clamp_that_the_op_cannot_take_is_refused():
    """A re-sealed ``post_bias`` that is not one finite value per column, or comes without a
    ``y_clip``, beside an activation, or on another op, is refused by the op with the reason,
    and the int8 kernel declines it with the same reason."""
    from fusegraph.ops import quantized
    from fusegraph.ops.registry import NodeContext
    from fusegraph.runtime.backends.cpu.dnnl.int8_support import post_bias_post_ops
    from fusegraph.runtime.backends.protocol import Decline
    cm = fg.compile(_bias_model(0.05, 1.0), CFG)
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QLinear"]
    good = list(p.attrs["post_bias"])
    assert len(good) == 24
    no_clip = {k: v for k, v in p.attrs.items() if k != "y_clip"}
    for attrs in ({**p.attrs, "post_bias": good[:23]}, {**p.attrs, "post_bias": [float("nan")] * 24},
                  {**p.attrs, "post_bias": ["a"] * 24}, no_clip, {**p.attrs, "activation": "relu"}):
        node = fg.ir.Node("QLinear", list(p.inputs), [fg.ir.Value("y", fg.ir.DType.UINT8, None)], attrs,
                          name="bad", domain="fusegraph")
        with pytest.raises(UnsupportedOpError, match="post_bias"):
            quantized._qlinear(NodeContext(node))
        if attrs.get("activation") != "relu":         # (the kernel's own checks: the op's, above)
            assert isinstance(post_bias_post_ops(NodeContext(node), 24, 0), Decline)
    conv = next(n for n in fg.compile(_conv_concat_model(), CFG).graph.nodes if n.op_type == "QConv")
    assert "post_bias" not in conv.attrs
    node = fg.ir.Node("QConv", list(conv.inputs), [fg.ir.Value("y", fg.ir.DType.UINT8, None)],
                      {**conv.attrs, "post_bias": [0.0] * 3}, name="bad", domain="fusegraph")
    with pytest.raises(UnsupportedOpError, match="post_bias"):
        quantized._qconv(NodeContext(node))


@pytest.mark.parametrize("case", ["short", "nan", "conv"])
def test_a_resealed_bias_after_the_clamp_is_refused_at_load(case, tmp_path):
    """An artifact whose checksums were recomputed after its ``post_bias`` was edited (one
    value short, a NaN) or given to a QConv is refused at load with the op's reason: the int8
    kernels are made only for nodes their op's checks take, so none runs it without reading
    the attribute."""
    from hostile_fgm import _resealed
    model = _conv_concat_model() if case == "conv" else _bias_model(0.05, 1.0)
    op = "QConv" if case == "conv" else "QLinear"
    src = tmp_path / "m0.fgm"
    fg.compile(model, CFG).save(src)

    def edit(header, parts):
        node = next(n for n in parts["graph"]["nodes"] if n["op_type"] == op)
        attrs = node["attrs"]
        if case == "short":
            attrs["post_bias"] = attrs["post_bias"][:-1]
        elif case == "nan":
            attrs["post_bias"] = [{"$float": "nan"}] * len(attrs["post_bias"])
        else:
            attrs["post_bias"] = [0.0] * 3
    bad = _resealed(edit)(src, tmp_path)
    fg.load(src)                       # the unedited file loads
    with pytest.raises(ArtifactError, match=f"{op}.*post_bias"):
        fg.load(bad)


def _conv_concat_model() -> onnx.ModelProto:
    """Two int8 convolutions quantised on their own ranges, joined by a Concat quantised on a
    range wider than either (as calibration makes a concat's): DQ(x) -> Conv(DQ(w_i)) -> Q_i ->
    DQ_i -> Concat -> Q -> DQ -> y."""
    rng = np.random.default_rng(10)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "s_a": np.array(0.03, np.float32), "z_a": np.array(10, np.uint8),
             "s_b": np.array(0.05, np.float32), "z_b": np.array(128, np.uint8),
             "s": np.array(0.08, np.float32), "z": np.array(100, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"])]
    for name in ("a", "b"):
        inits[f"w_{name}"] = rng.integers(-127, 128, (3, 4, 3, 3), dtype=np.int8)
        inits[f"ws_{name}"] = (rng.uniform(0.5, 1.5, 3) * 0.01).astype(np.float32)
        inits[f"wz_{name}"] = np.zeros(3, np.int8)
        nodes += [helper.make_node("DequantizeLinear", [f"w_{name}", f"ws_{name}", f"wz_{name}"], [f"wd_{name}"], axis=0),
                  helper.make_node("Conv", ["xd", f"wd_{name}"], [f"c_{name}"], pads=[1, 1, 1, 1]),
                  helper.make_node("QuantizeLinear", [f"c_{name}", f"s_{name}", f"z_{name}"], [f"q_{name}"]),
                  helper.make_node("DequantizeLinear", [f"q_{name}", f"s_{name}", f"z_{name}"], [f"d_{name}"])]
    nodes += [helper.make_node("Concat", ["d_a", "d_b"], ["cat"], axis=1),
              helper.make_node("QuantizeLinear", ["cat", "s", "z"], ["q"]),
              helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    g = helper.make_graph(nodes, "conv_concat", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 6, 6])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


def test_convolutions_joined_on_a_wider_range_keep_their_own_clamps():
    """A concat's requantisation of each branch folds into the branch's convolution (no
    Requantize left), and each convolution clamps its result to its own range first
    (``y_clip``): a value the file clamps at the branch's quantisation is clamped here too, so
    every output is within ``rounding_bound`` of onnxruntime ORT_DISABLE_ALL, on oneDNN's int8
    convolution where this CPU has one (inputs of the full uint8 range saturate both branches)."""
    m = _conv_concat_model()
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QConv"] == 2 and not ops["Requantize"], ops
    clips = sorted(tuple(n.attrs["y_clip"]) for n in cm.graph.nodes if n.op_type == "QConv")
    assert np.allclose(clips, sorted([(0.03 * -10, 0.03 * 245), (0.05 * -128, 0.05 * 127)]), rtol=1e-6)
    if M.int8_kernels_exact():
        from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
        kernels = [getattr(c.kernel, "fast", c.kernel) for c in cm._executor.binding.calls if c.node.op_type == "QConv"]
        assert len(kernels) == 2 and all(isinstance(k, DnnlKernel) and not k.impl.startswith("ref") for k in kernels), \
            cm.report.kernels["declined"]
    bound = rounding_bound(0.05, 0.08)
    saturated = 0
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).integers(0, 256, (1, 4, 6, 6), dtype=np.uint8)}
        (ref,) = M.ort_run(m, feeds)
        y = cm.run(feeds)["y"]
        assert (np.abs(y.astype(np.float64) - ref) / np.float32(0.08)).max() <= bound + 1e-3
        saturated += int((np.isclose(ref[:, :3], 0.03 * 245, atol=0.05)).sum())
    assert saturated > 0            # the first branch's clamp was reached


def _conv_residual_model(c: int = 16) -> onnx.ModelProto:
    """A residual block's end as a QDQ file writes it: DQ(x) -> Conv(DQ(w)) -> Q1 -> DQ1, plus
    DQ(z) -> Add -> Relu -> Q2 -> y (uint8, as the next int8 op reads it), Q1's range narrower
    than the convolution's values for full-range inputs (calibration saw smaller ones); ``c``
    channels (16: oneDNN's float32 kernels have no clamp before a sum below 8)."""
    rng = np.random.default_rng(11)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": rng.integers(-127, 128, (c, c, 3, 3), dtype=np.int8),
             "ws": (rng.uniform(0.5, 1.5, c) * 0.01 * 2 / np.sqrt(c)).astype(np.float32), "wz": np.zeros(c, np.int8),
             "s1": np.array(0.02, np.float32), "z1": np.array(128, np.uint8),
             "zs": np.array(0.03, np.float32), "zz": np.array(128, np.uint8),
             "s2": np.array(0.04, np.float32), "z2": np.array(0, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("DequantizeLinear", ["z", "zs", "zz"], ["zd"]),
             helper.make_node("Add", ["d1", "zd"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["y"])]
    g = helper.make_graph(nodes, "conv_residual",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c, 6, 6]),
                           helper.make_tensor_value_info("z", TensorProto.UINT8, [1, c, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, c, 6, 6])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("form", ["int8", "float", "reference"])
def test_a_residual_convolution_keeps_its_own_clamp_before_the_sum(form, monkeypatch):
    """``qdq_residual`` folds the block's end into one QConv with the residual and the Relu,
    and clamps the convolution's result to its own quantisation's range before the residual is
    added (``conv_clip``; oneDNN's ``clip`` post-op before its ``sum``, or the op's own clamp
    where the int8 kernel declines): every output within ``rounding_bound`` of onnxruntime
    ORT_DISABLE_ALL, with full-range inputs that the file's first quantisation clamps (``form``:
    ``M.int8_form``)."""
    M.int8_form(monkeypatch, form)
    m = _conv_residual_model()
    cm = fg.compile(m, CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QConv"] == 1 and not ops["QAdd"] and not ops["Relu"], ops
    (p,) = [n for n in cm.graph.nodes if n.op_type == "QConv"]
    assert len(p.inputs) == 5 and p.attrs["activation"] == "relu"
    assert np.allclose(p.attrs["conv_clip"], [0.02 * -128, 0.02 * 127], rtol=1e-6)
    if form != "reference":
        onednn_call(cm, "QConv")
    bound = rounding_bound(0.02, 0.04)
    for seed in range(3):
        r = np.random.default_rng(seed)
        feeds = {"x": r.integers(0, 256, (1, 16, 6, 6), dtype=np.uint8),
                 "z": r.integers(0, 256, (1, 16, 6, 6), dtype=np.uint8)}
        (ref,) = M.ort_run(m, feeds)
        y = cm.run(feeds)["y"]
        assert y.dtype == np.uint8 and np.abs(y.astype(np.int64) - ref).max() <= bound
