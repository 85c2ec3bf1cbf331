"""fusegraph's own post-training int8 quantisation (``precision="int8"``, issue 37 part 2)
through the public API.

Oracles:
- static (calibration inputs): the QDQ graph fusegraph wrote, rebuilt here independently as an
  ONNX model (``qdq_oracle``: numpy, from the fp32 model, the activation scales and zero points
  the report lists, and onnxruntime ``quantize_static``'s weight and bias arithmetic) and run by
  onnxruntime ORT_DISABLE_ALL. fusegraph's float output may differ by one quantisation step of
  its last product's input (``one_step``: a value on a rounding tie, or a sum rounded once where
  the QDQ graph rounds twice, ``qdq_propagate.rounding_bound``, moves it). The calibrated
  ranges themselves are checked against the tensors' min / max computed by onnxruntime.
- dynamic (no calibration inputs): onnxruntime's own ``quantize_dynamic`` (int8 weights per
  column) of the fp32 model, which writes the same weights and arithmetic: equal outputs.
- against the fp32 model (onnxruntime): relative L2 small, and no worse than onnxruntime
  ``quantize_static``'s with the same calibration inputs (x 1.1 + a little).
"""
from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import ConfigError, InputError, UsageError

import int8_models as M

pytest.importorskip("onnxruntime.quantization")
CFG = fg.Config(threads=2, precision="int8")
SEEDS = (3, 4)
CALIBRATION = 8
needs_int8_kernels = pytest.mark.skipif(not M.int8_kernels_exact(), reason=M.INT8_KERNELS_WHY)


def calibration(model, n=CALIBRATION):
    return M.calibration_feeds(model, n)



# ---------------------------------------------------------------- the independent QDQ oracle

def _weight(w: np.ndarray, axis: int):
    """onnxruntime quantize_static's per-channel symmetric int8 weight (numpy)."""
    ch = w.shape[axis]
    absmax = np.abs(np.moveaxis(w, axis, 0).reshape(ch, -1)).max(axis=1).astype(np.float32)
    scale = (np.float32(2) * absmax / np.float32(254)).astype(np.float32)
    scale[scale < np.finfo(np.float32).tiny] = 1.0
    shape = [1] * w.ndim
    shape[axis] = ch
    return np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def qdq_oracle(model: onnx.ModelProto, precision: dict) -> onnx.ModelProto:
    """``model`` with Q / DQ pairs on the activations ``precision["int8"]`` lists and its int8
    products' weights and biases quantised (numpy, independent of fusegraph)."""
    acts = {a["tensor"]: (np.float32(a["scale"]), np.uint8(a["zero_point"])) for a in precision["int8"]["activations"]}
    int8 = {r["node"] for r in precision["nodes"] if r["dtype"] == "int8"}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    extra, nodes = [], []

    def pair(name):
        s, z = acts[name]
        extra.extend([numpy_helper.from_array(np.array(s, np.float32), f"{name}_s"),
                      numpy_helper.from_array(np.array(z, np.uint8), f"{name}_z")])
        return [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
                helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])]

    for i in model.graph.input:
        if i.name in acts:
            nodes += pair(i.name)
    for n in model.graph.node:
        n = onnx.NodeProto.FromString(n.SerializeToString())
        name = n.name or n.output[0]
        ins = list(n.input)
        for k, x in enumerate(ins):
            if x in acts:
                ins[k] = f"{x}_dq"
        if name in int8:
            axis = 0 if n.op_type == "Conv" else 1
            if n.op_type == "Gemm":
                axis = 0 if any(a.name == "transB" and a.i for a in n.attribute) else 1
            wq, ws = _weight(inits[n.input[1]], axis)
            w = n.input[1]
            extra += [numpy_helper.from_array(wq, f"{w}_wq"), numpy_helper.from_array(ws, f"{w}_ws"),
                      numpy_helper.from_array(np.zeros(ws.size, np.int8), f"{w}_wz")]
            nodes.append(helper.make_node("DequantizeLinear", [f"{w}_wq", f"{w}_ws", f"{w}_wz"], [f"{w}_wdq"], axis=axis))
            ins[1] = f"{w}_wdq"
            if len(n.input) > 2 and n.input[2] and n.op_type != "MatMul":
                b = n.input[2]
                bs = (acts[n.input[0]][0] * ws).astype(np.float32)
                bq = np.round(inits[b].astype(np.float32) / bs).astype(np.int32)
                extra += [numpy_helper.from_array(bq, f"{b}_bq"), numpy_helper.from_array(bs, f"{b}_bs"),
                          numpy_helper.from_array(np.zeros(bs.size, np.int32), f"{b}_bz")]
                nodes.append(helper.make_node("DequantizeLinear", [f"{b}_bq", f"{b}_bs", f"{b}_bz"], [f"{b}_bdq"],
                                              axis=0))
                ins[2] = f"{b}_bdq"
        del n.input[:]
        n.input.extend(ins)
        nodes.append(n)
        for o in n.output:
            if o in acts:
                nodes += pair(o)
    used = {x for n in nodes for x in n.input}
    g = helper.make_graph(nodes, "oracle", list(model.graph.input), list(model.graph.output),
                          [i for i in list(model.graph.initializer) + extra if i.name in used])
    q = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    q.ir_version = 8
    onnx.checker.check_model(q)
    return q


def one_step(model: onnx.ModelProto, precision: dict) -> np.ndarray:
    """How far the output moves when every element of the last product's quantised input moves
    one step: ``x_scale * sum_k |W_q[k, n]| * w_scale[n]`` per output column."""
    last = model.graph.node[-1]
    while last.op_type not in ("Gemm", "MatMul"):
        last = next(n for n in model.graph.node if last.input[0] in n.output)
    acts = {a["tensor"]: a["scale"] for a in precision["int8"]["activations"]}
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == last.input[1]))
    trans = last.op_type == "Gemm" and any(a.name == "transB" and a.i for a in last.attribute)
    wq, ws = _weight(w.T if trans else w, 1)
    return acts[last.input[0]] * np.abs(wq.astype(np.float64)).sum(axis=0) * ws


def int8_products(cm) -> collections.Counter:
    return collections.Counter(n.op_type for n in cm.graph.nodes
                               if n.op_type in ("QConv", "QLinear", "QLinearDynamic", "Conv", "MatMul", "Gemm",
                                                "FusedConv", "Linear", "LinearAct"))


@pytest.fixture(scope="module")
def conv_model():
    m = M.conv_net()
    return m, fg.compile(m, CFG, calibration_inputs=calibration(m))


@pytest.fixture(scope="module")
def block_model():
    m = M.matmul_block(seq=16)
    return m, fg.compile(m, CFG, calibration_inputs=calibration(m))


# ---------------------------------------------------------------- (a) the oracle, the fp32 model

@pytest.mark.parametrize("which", ["conv_model", "block_model"])
def test_matches_the_qdq_oracle_and_the_fp32_model(which, request, tmp_path):
    m, cm = request.getfixturevalue(which)
    prec = cm.report.precision
    oracle = qdq_oracle(m, prec)
    ort_static = M.quantize(m, tmp_path, which, calib=CALIBRATION)     # onnxruntime's own, same inputs
    bound = one_step(m, prec)
    limit = 3e-2 if which == "conv_model" else 6e-2
    for seed in SEEDS:
        feeds = M.feeds_for(m, seed)
        (y,) = cm.run(feeds).values()
        (ref,) = M.ort_run(oracle, feeds)
        (yf,) = M.ort_run(m, feeds)
        (yo,) = M.ort_run(ort_static, feeds)
        steps = np.abs(np.asarray(y, np.float64) - ref) / bound
        assert steps.max() <= 1.0, f"seed {seed}: {steps.max():.3f} steps of the last product's input"
        assert M.rel_l2(y, yf) < limit, M.rel_l2(y, yf)
        assert M.rel_l2(y, yf) <= 1.1 * M.rel_l2(yo, yf) + 5e-3, (M.rel_l2(y, yf), M.rel_l2(yo, yf))


def test_minmax_ranges_are_the_tensors_min_and_max(conv_model):
    """Each observed activation's range is what it held over the calibration inputs (computed
    by onnxruntime on the fp32 model); its scale and zero point are onnxruntime's formula."""
    m, cm = conv_model
    acts = [a for a in cm.report.precision["int8"]["activations"] if a["same_as"] is None]
    names = [a["tensor"] for a in acts if a["tensor"] != "x"]
    probe = onnx.ModelProto.FromString(m.SerializeToString())
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    seen = {n: [] for n in ["x"] + names}
    for feeds in calibration(m):
        outs = M.ort_run(probe, feeds)[1:]
        seen["x"].append(feeds["x"])
        for n, o in zip(names, outs):
            seen[n].append(o)
    for a in acts:
        values = np.concatenate([v.ravel() for v in seen[a["tensor"]]])
        assert a["lo"] == pytest.approx(float(values.min()), rel=1e-6, abs=1e-7), a
        assert a["hi"] == pytest.approx(float(values.max()), rel=1e-6), a
        rmin, rmax = np.float32(min(a["lo"], 0)), np.float32(max(a["hi"], 0))   # as fusegraph's fp32 run saw them
        scale = np.float32((rmax - rmin) / np.float32(255))
        assert a["scale"] == float(scale) and a["zero_point"] == int(np.round(-rmin / scale)), a


# ---------------------------------------------------------------- (b) the int8 kernels, the report

def test_report_says_which_products_run_int8(conv_model):
    _, cm = conv_model
    ops = int8_products(cm)
    assert ops == {"QConv": 4, "QLinear": 1}, ops
    prec = cm.report.precision
    assert prec["policy"] == "int8" and prec["by_dtype"] == {"int8": 5} and not prec["kept_fp32"]
    assert all(r["code"] == "int8" for r in prec["nodes"])
    assert prec["int8"]["mode"] == "static" and prec["int8"]["calibration_inputs"] == CALIBRATION
    residual = [n for n in cm.graph.nodes if n.op_type == "QConv" and len(n.inputs) == 5]
    assert len(residual) == 1, "the residual Add is fused into its convolution (qdq_residual)"
    assert "int8: 5 product(s), calibrated (minmax)" in str(cm.report)


@needs_int8_kernels
def test_products_run_on_onednn_int8_kernels(conv_model, block_model):
    from fusegraph.runtime.backends.cpu.dnnl.call import DnnlKernel
    for _, cm in (conv_model, block_model):
        declined = {d["node"] for d in cm.report.kernels["declined"]}
        calls = [c for c in cm._executor.binding.calls if c.node.op_type in ("QConv", "QLinear")]
        assert calls
        for c in calls:
            k = getattr(c.kernel, "kernel", c.kernel)
            k = getattr(k, "fast", k)
            assert c.node.name not in declined and isinstance(k, DnnlKernel), c.node.name
            assert M.int8_dot_products(k.impl), (c.node.name, k.impl)


# ---------------------------------------------------------------- (c) calibration methods

def test_calibration_methods_choose_different_ranges_on_outliers():
    """Inputs with a few large outliers: minmax spans them, percentile and entropy clip them,
    each to its own threshold; the clipped ranges quantise the ordinary inputs better."""
    m = M.matmul_block(seq=64)
    feeds = calibration(m, 16)
    for f in feeds[:2]:
        f["x"].reshape(-1)[[5, 700]] = [40.0, -40.0]
    his = {}
    errors = {}
    for method, extra in (("minmax", {}), ("percentile", {"calibration_percentile": 99.9}), ("entropy", {})):
        cm = fg.compile(m, CFG.replace(calibration=method, **extra), calibration_inputs=feeds)
        (x,) = [a for a in cm.report.precision["int8"]["activations"] if a["tensor"] == "x"]
        assert x["min"] == -40.0 and x["max"] == 40.0
        his[method] = x["hi"]
        test = M.feeds_for(m, 3)
        (y,) = cm.run(test).values()
        errors[method] = M.rel_l2(y, M.ort_run(m, test)[0])
    assert his["minmax"] == 40.0
    assert his["percentile"] < 10 and his["entropy"] < 10, his
    assert his["percentile"] != his["entropy"], his
    assert errors["percentile"] < errors["minmax"] and errors["entropy"] < errors["minmax"], errors


def test_percentile_knob_changes_the_range():
    m = M.matmul_block(seq=64)
    feeds = calibration(m, 16)
    got = []
    for pct in (99.0, 99.99):
        cm = fg.compile(m, CFG.replace(calibration="percentile", calibration_percentile=pct), calibration_inputs=feeds)
        got.append(next(a["hi"] for a in cm.report.precision["int8"]["activations"] if a["tensor"] == "x"))
    assert got[0] < got[1], got


# ---------------------------------------------------------------- (d) op_precision

def test_op_precision_keeps_a_named_product_fp32(conv_model):
    m, _ = conv_model
    cm = fg.compile(m, CFG.replace(op_precision={"y": "fp32"}), calibration_inputs=calibration(m))
    ops = int8_products(cm)
    assert ops["QConv"] == 4 and ops["QLinear"] == 0 and ops["Linear"] + ops["Gemm"] == 1, ops
    kept = cm.report.precision["kept_fp32"]
    assert [(k["node"], k["code"]) for k in kept] == [("y", "op_precision")]


def test_op_precision_name_wins_over_type(conv_model):
    m, _ = conv_model
    cm = fg.compile(m, CFG.replace(op_precision={"Conv": "fp32", "c1": "int8"}), calibration_inputs=calibration(m))
    nodes = {r["node"]: r["dtype"] for r in cm.report.precision["nodes"]}
    assert nodes == {"c0": "fp32", "c1": "int8", "c2": "fp32", "c3": "fp32", "y": "int8"}, nodes
    assert int8_products(cm)["QConv"] == 1


# ---------------------------------------------------------------- (e) refusals

def test_bad_configs_are_refused():
    with pytest.raises(ConfigError, match="Config.calibration is read by precision='int8' only"):
        fg.Config(calibration="entropy")
    with pytest.raises(ConfigError, match="Config.calibration must be one of .*'kl'"):
        fg.Config(precision="int8", calibration="kl")
    with pytest.raises(ConfigError, match="calibration_percentile is read by calibration='percentile' only"):
        fg.Config(precision="int8", calibration_percentile=99.9)
    with pytest.raises(ConfigError, match="calibration_percentile must be a percentile"):
        fg.Config(precision="int8", calibration="percentile", calibration_percentile=101)
    with pytest.raises(ConfigError, match=r"'Conv': 'bf16'.*under precision='int8'"):
        fg.Config(precision="int8", op_precision={"Conv": "bf16"})
    with pytest.raises(ConfigError, match=r"int8 entries need precision='int8'"):
        fg.Config(precision="bf16", op_precision={"Conv": "int8"})
    with pytest.raises(UsageError, match="calibration_inputs apply to precision='auto'"):
        fg.compile(M.conv_net(), fg.Config(), calibration_inputs=calibration(M.conv_net(), 1))


def test_bad_calibration_inputs_name_what_was_wrong():
    m = M.conv_net()
    with pytest.raises(InputError, match=r"calibration input 0: unknown input name\(s\) \['image'\]"):
        fg.compile(m, CFG, calibration_inputs=[{"image": np.zeros((1, 3, 16, 16), np.float32)}])
    with pytest.raises(InputError, match="calibration input 1.*x"):
        fg.compile(m, CFG, calibration_inputs=[M.feeds_for(m, 0), {"x": np.zeros((1, 3, 8, 8), np.float32)}])
    with pytest.raises(InputError, match="non-empty list"):
        fg.compile(m, CFG, calibration_inputs=[])


def test_int8_entries_must_name_a_product_that_can_run_int8():
    m = M.conv_net()
    with pytest.raises(ConfigError, match=r"'g' in int8, which is no Conv / MatMul / Gemm"):
        fg.compile(m, CFG.replace(op_precision={"g": "int8"}), calibration_inputs=calibration(m, 1))


def test_no_calibration_refuses_convolutions():
    with pytest.raises(UsageError, match=r"convolution\(s\) c0, c1, c2 .* need calibration_inputs"):
        fg.compile(M.conv_net(), CFG)


# ---------------------------------------------------------------- dynamic (no calibration)

def test_without_calibration_a_transformer_block_is_quantised_dynamically(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    m = M.matmul_block(seq=16)
    cm = fg.compile(m, CFG)
    assert int8_products(cm) == {"QLinearDynamic": 3}
    prec = cm.report.precision
    assert prec["int8"]["mode"] == "dynamic" and prec["by_dtype"] == {"int8": 3}
    onnx.save(m, tmp_path / "m.onnx")
    quantize_dynamic(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8, per_channel=True)
    q = onnx.load(str(tmp_path / "q.onnx"))
    for seed in SEEDS:
        feeds = M.feeds_for(m, seed)
        (y,) = cm.run(feeds).values()
        (ref,) = M.exact_run(q, feeds)      # onnxruntime's MatMulInteger saturates without int8 dot products
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
        assert M.rel_l2(y, M.ort_run(m, feeds)[0]) < 3e-2


# ---------------------------------------------------------------- (f) the artifact

def _wide_conv(c=128, layers=4) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {"w0": M._he(rng, (c, 3, 3, 3), 27), "b0": np.zeros(c, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"])]
    for i in range(1, layers + 1):
        inits[f"w{i}"] = M._he(rng, (c, c, 3, 3), 9 * c)
        inits[f"b{i}"] = (rng.standard_normal(c) * 0.1).astype(np.float32)
        nodes += [helper.make_node("Conv", [f"r{i - 1}", f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    return M._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                    [helper.make_tensor_value_info(f"r{layers}", TensorProto.FLOAT, [1, c, 16, 16])], inits, "wide")


def test_fgm_round_trip_is_bitwise_and_small(tmp_path, monkeypatch):
    # the artifact holds the weights in the layout the int8 kernels read: on AMX that layout
    # pads the input channels to a multiple of 64 (96 take 128), so the width is one
    m = _wide_conv()
    fp32, q = tmp_path / "fp32.fgm", tmp_path / "int8.fgm"
    fg.compile(m, fg.Config(threads=2)).save(fp32)
    cm = fg.compile(m, CFG, calibration_inputs=calibration(m, 4))
    cm.save(q)
    assert os.path.getsize(q) <= 0.3 * os.path.getsize(fp32), (os.path.getsize(q), os.path.getsize(fp32))
    import fusegraph.passes as passes
    monkeypatch.setattr(passes, "optimize", lambda *a, **k: pytest.fail("load ran a pass"))
    loaded = fg.load(q)
    assert int8_products(loaded) == {"QConv": 5}
    assert loaded.report.precision["int8"]["mode"] == "static"
    for seed in SEEDS:
        feeds = M.feeds_for(m, seed)
        a, b = cm.run(feeds), loaded.run(feeds)
        for k in a:
            assert np.array_equal(a[k], b[k])


@pytest.mark.parametrize("calibrated", [True, False], ids=["static", "dynamic"])
def test_symbolic_rows(calibrated):
    """A model whose sequence axis is symbolic: calibrated over inputs of several lengths (one
    compile serves every shape), then run at lengths it was not calibrated on."""
    from test_int8_dynamic import symbolic_rows
    m = symbolic_rows(M.matmul_block(seq=16))
    rng = np.random.default_rng(0)
    cal = [{"x": rng.standard_normal((1, s, 32)).astype(np.float32)} for s in (8, 16, 24)] if calibrated else None
    cm = fg.compile(m, CFG, calibration_inputs=cal)
    assert cm.report.precision["by_dtype"] == {"int8": 3}
    for s in (5, 16):
        x = {"x": rng.standard_normal((1, s, 32)).astype(np.float32)}
        (y,) = cm.run(x).values()
        assert y.shape == (1, s, 32) and M.rel_l2(y, M.ort_run(m, x)[0]) < 6e-2


def test_a_sum_residual_is_fused_like_an_add():
    """ResNets exported with a two-input ``Sum`` for the residual quantise it as an ``Add``:
    the sum is fused into its convolution."""
    m = M.conv_net()
    next(n for n in m.graph.node if n.op_type == "Add").op_type = "Sum"
    cm = fg.compile(m, CFG, calibration_inputs=calibration(m))
    assert [n.op_type for n in cm.graph.nodes if n.op_type in ("Sum", "Add")] == []
    assert len([n for n in cm.graph.nodes if n.op_type == "QConv" and len(n.inputs) == 5]) == 1
    feeds = M.feeds_for(m, 3)
    assert M.rel_l2(cm.run(feeds)["y"], M.ort_run(m, feeds)[0]) < 3e-2
