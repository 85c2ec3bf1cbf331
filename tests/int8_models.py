"""Small fp32 ONNX models and their onnxruntime quantisations (``quantize_static``: QDQ or
QOperator, per-channel int8 weights, uint8 activations, calibrated on random inputs) for the
int8 tests: a conv net (Conv + Relu, a residual Add, MaxPool, GlobalAveragePool, a Gemm head)
and a transformer-ish MatMul + Add block. Weights are random and He-scaled."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _model(nodes, inputs, outputs, inits, name):
    g = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def conv_net(seed=0, head="Gemm") -> onnx.ModelProto:
    """x[1,3,16,16] -> Conv+Relu -> Conv+Relu -> Conv, + residual, Relu -> MaxPool -> Conv+Relu
    -> GlobalAveragePool -> Flatten -> Gemm (or MatMul + Add) -> logits[1,10]."""
    rng = np.random.default_rng(seed)
    c = 16
    inits = {
        "w0": _he(rng, (c, 3, 3, 3), 27), "b0": (rng.standard_normal(c) * 0.1).astype(np.float32),
        "w1": _he(rng, (c, c, 3, 3), 9 * c), "b1": (rng.standard_normal(c) * 0.1).astype(np.float32),
        "w2": _he(rng, (c, c, 3, 3), 9 * c), "b2": (rng.standard_normal(c) * 0.1).astype(np.float32),
        "w3": _he(rng, (2 * c, c, 1, 1), c), "b3": (rng.standard_normal(2 * c) * 0.1).astype(np.float32),
        "bh": (rng.standard_normal(10) * 0.1).astype(np.float32),
    }
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], **pads), helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], **pads), helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **pads),
        helper.make_node("Add", ["c2", "r0"], ["s"]), helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w3", "b3"], ["c3"]), helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
    ]
    if head == "Gemm":
        inits["wh"] = _he(rng, (10, 2 * c), 2 * c)
        nodes.append(helper.make_node("Gemm", ["f", "wh", "bh"], ["y"], transB=1))
    else:
        inits["wh"] = _he(rng, (2 * c, 10), 2 * c)
        nodes += [helper.make_node("MatMul", ["f", "wh"], ["mm"]), helper.make_node("Add", ["mm", "bh"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits, "conv_net")


def conv_only(seed=0) -> onnx.ModelProto:
    """Conv+Relu -> Conv+Relu -> Conv: in QOperator format onnxruntime writes only standard ops
    (QuantizeLinear, QLinearConv, DequantizeLinear)."""
    rng = np.random.default_rng(seed)
    inits = {"w0": _he(rng, (8, 3, 3, 3), 27), "b0": (rng.standard_normal(8) * 0.1).astype(np.float32),
             "w1": _he(rng, (16, 8, 3, 3), 72), "b1": (rng.standard_normal(16) * 0.1).astype(np.float32),
             "w2": _he(rng, (8, 16, 1, 1), 16), "b2": (rng.standard_normal(8) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits, "conv_only")


def matmul_block(seed=0, seq=8, d=32, ff=64) -> onnx.ModelProto:
    """x[1,seq,d] -> MatMul+Add -> Relu -> MatMul+Add, + x (residual) -> MatMul -> y[1,seq,d]."""
    rng = np.random.default_rng(seed)
    inits = {"w1": _he(rng, (d, ff), d), "b1": (rng.standard_normal(ff) * 0.1).astype(np.float32),
             "w2": _he(rng, (ff, d), ff), "b2": (rng.standard_normal(d) * 0.1).astype(np.float32),
             "w3": _he(rng, (d, d), d)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["a2"]),
             helper.make_node("Add", ["a2", "x"], ["s"]),
             helper.make_node("MatMul", ["s", "w3"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits, "matmul_block")


def attention_block(seed=0, seq=8, d=32, heads=2) -> onnx.ModelProto:
    """x[1,seq,d] -> q, k, v products, split into heads -> softmax(q @ k^T / sqrt(dh)) @ v ->
    heads merged -> MatMul -> y[1,seq,d]: two products of activations (what a transformer's
    attention quantises as MatMul(DQ, DQ))."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    inits = {f"w{t}": _he(rng, (d, d), d) for t in "qkvo"}
    inits.update({"heads_shape": np.array([1, seq, heads, dh], np.int64), "merged": np.array([1, seq, d], np.int64),
                  "scale": np.array(1.0 / np.sqrt(dh), np.float32)})
    nodes = []
    for t in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{t}"], [f"{t}0"]),
                  helper.make_node("Reshape", [f"{t}0", "heads_shape"], [f"{t}1"]),
                  helper.make_node("Transpose", [f"{t}1"], [f"{t}h"], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["scores"]), helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merged"], ["ctx_m"]),
              helper.make_node("MatMul", ["ctx_m", "wo"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits, "attention_block")


def outlier_net(seed=0, outlier=1000.0, batch=1) -> onnx.ModelProto:
    """x[batch,8,16,16] -> conv1 (8->16) + Relu -> conv2 (16->16) + Relu -> conv3 + Relu -> conv4
    -> GlobalAveragePool -> Flatten -> Gemm "head" -> y[batch,10]. conv1's output channel 0 is
    ``outlier`` times larger than the others and conv2 reads it with weights ``outlier`` times
    smaller: in float32 every channel counts alike, but conv2's input, quantised per tensor,
    spends its 256 levels on that one channel and rounds the others to a few levels. conv2 is
    the product whose quantisation costs the most (its share of the products' work: about a
    quarter)."""
    rng = np.random.default_rng(seed)
    c = 16
    w1, w2 = _he(rng, (c, 8, 3, 3), 72), _he(rng, (c, c, 3, 3), 9 * c)
    w1[0] *= outlier
    w2[:, 0] /= outlier
    inits = {"w1": w1, "b1": (rng.standard_normal(c) * 0.1).astype(np.float32),
             "w2": w2, "b2": (rng.standard_normal(c) * 0.1).astype(np.float32),
             "w3": _he(rng, (c, c, 3, 3), 9 * c), "b3": (rng.standard_normal(c) * 0.1).astype(np.float32),
             "w4": _he(rng, (c, c, 3, 3), 9 * c), "b4": (rng.standard_normal(c) * 0.1).astype(np.float32),
             "wh": _he(rng, (10, c), c), "bh": (rng.standard_normal(10) * 0.1).astype(np.float32)}
    inits["b1"][0] *= outlier
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", **pads),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", **pads),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3", **pads),
             helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
             helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"], name="conv4", **pads),
             helper.make_node("GlobalAveragePool", ["c4"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wh", "bh"], ["y"], name="head", transB=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits, "outlier_net")


def feeds_for(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def quantize(model: onnx.ModelProto, tmp_dir, name: str, fmt: str = "QDQ", calib: int = 8) -> onnx.ModelProto:
    """``model`` quantised by onnxruntime's ``quantize_static`` (per-channel int8 weights, uint8
    activations) in ``fmt`` ("QDQ" or "QOperator"), calibrated on ``calib`` random inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([feeds_for(model, 1000 + i) for i in range(calib)])

        def get_next(self):
            return next(self.it, None)

    src, dst = f"{tmp_dir}/{name}_fp32.onnx", f"{tmp_dir}/{name}_{fmt}.onnx"
    onnx.save(model, src)
    quantize_static(src, dst, Reader(), quant_format=getattr(QuantFormat, fmt), per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return onnx.load(dst)


def ort_run(model: onnx.ModelProto, feeds, optimise: bool = False) -> list[np.ndarray]:
    """onnxruntime's outputs (ORT_DISABLE_ALL unless ``optimise``)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimise
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def exact_run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    """``onnx.reference``'s outputs: the integer products summed exactly, as the ONNX spec
    says. The oracle for a model whose int8 ops onnxruntime runs as such (QLinearConv,
    QLinearMatMul, MatMulInteger, ``quantize_dynamic``'s products), which on a CPU without
    int8 dot products (AVX2 only: MLAS's u8 x s8 kernel sums pairs in 16 bits) saturate."""
    from onnx import version_converter
    from onnx.reference import ReferenceEvaluator
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 19:      # onnx.reference's (De)QuantizeLinear start at version 19
        model = version_converter.convert_version(model, 19)
    return ReferenceEvaluator(model).run(None, feeds)


def calibration_feeds(model: onnx.ModelProto, n: int = 4) -> list[dict[str, np.ndarray]]:
    """``n`` calibration inputs of ``model``, seeds apart from the accuracy inputs' (1000 on)."""
    return [feeds_for(model, 1000 + i) for i in range(n)]


def rel_l2(a, b) -> float:
    """Relative L2 error of ``a`` against ``b``, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def int8_kernels_exact() -> bool:
    """oneDNN loads here and sums int8 exactly (VNNI / AMX): the int8 ops run on its kernels."""
    from fusegraph.runtime.backends.cpu.dnnl import available
    from fusegraph.runtime.backends.cpu.dnnl.int8_support import int8_exact
    return available() and int8_exact()


def int8_form(monkeypatch, form: str) -> None:
    """Make QConv / QLinear / QMatMul / QLinearDynamic run ``form`` for the rest of a test: "int8" (the
    int8 kernels; the test skips where this CPU's int8 sums are not exact), "float" (the float32
    form, ``dnnl/int8_float.py``, as on a CPU without exact int8 sums) or "reference" (the
    ops' own kernels, as where both decline)."""
    if form == "int8":
        if not int8_kernels_exact():        # the float32 form runs here: the "float" case is this one
            import pytest
            pytest.skip("no exact int8 sums here: the int8 ops run the float32 form, tested as such")
        return
    from fusegraph.runtime.backends.cpu import dnnl
    from fusegraph.runtime.backends.cpu.dnnl import conv_int8
    from fusegraph.runtime.backends.protocol import Decline
    monkeypatch.setattr(conv_int8, "int8_exact", lambda: False)
    monkeypatch.setattr(dnnl, "int8_exact", lambda: False)
    if form == "reference":
        for name in ("float_qconv_kernel", "float_qlinear_kernel", "float_qmatmul_kernel", "float_qlinear_dynamic_kernel"):
            monkeypatch.setattr(dnnl, name, lambda *a: Decline("the reference form, asked by the test", "dnnl"))
    else:
        assert form == "float", form


INT8_KERNELS_WHY = ("oneDNN's int8 kernels are not exact here (no VNNI / AMX) or oneDNN does not load: "
                    "the int8 ops run their float32 form (or, without oneDNN, their reference form)")


def int8_dot_products(impl: str) -> bool:
    """Whether a oneDNN implementation name is one of its int8 dot-product kernels (VNNI or
    AMX), not a reference one."""
    return bool(impl) and not impl.startswith("ref") and ("vnni" in impl or "amx" in impl)
