"""onnxruntime ``quantize_dynamic`` files (issue 37 part 3) through the public API: each
``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul [-> Add]`` becomes one
``fusegraph::QLinearDynamic`` on oneDNN's int8 matmul (where this CPU sums int8 exactly),
with static rows and with rows known at run time only.

Oracle: onnxruntime ORT_DISABLE_ALL on the same quantised file. The bounds:
- ``DynamicQuantizeLinear`` gives the ONNX reference's bytes, scale and zero point bit for bit
  (checked on the values fusegraph computed, and at rounding ties).
- One product whose activation is quantised identically: the integer sum is exact and the
  dequantisation is the model's own (``Cast``, times the float32 product of the scales, plus
  the bias), so the output agrees to float32 rounding: ``|dy| <= 2^-22 (|y| + |b|)``.
- A chain: a float32 difference of rounding size in a product's input can move one of its
  quantised values by one step where it lies on a rounding tie, which moves output ``n`` by
  at most ``x_scale * sum_k |W_q[k, n]| * w_scale[n]`` (every element moving one step: the
  bound ``one_step``), checked on the last product of the block with its run-time scale.
"""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import fusegraph as fg
from fusegraph.runtime.backends.cpu.dnnl import available

import int8_models as M

pytest.importorskip("onnxruntime.quantization")
CFG = fg.Config(threads=2)
SEEDS = (3, 4)
needs_int8_kernels = pytest.mark.skipif(not M.int8_kernels_exact(), reason=M.INT8_KERNELS_WHY)


def quantize_dynamic(model: onnx.ModelProto, tmp, name: str, per_channel: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic as qd
    src, dst = tmp / f"{name}.onnx", tmp / f"{name}_dyn.onnx"
    onnx.save(model, str(src))
    qd(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
    return onnx.load(str(dst))


def with_outputs(q: onnx.ModelProto, names) -> onnx.ModelProto:
    """``q`` with the values ``names`` as extra graph outputs (type left to inference)."""
    q = onnx.ModelProto.FromString(q.SerializeToString())
    q.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    return q


def symbolic_rows(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its input's and output's sequence axis (dim 1) named, not fixed."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    for v in list(m.graph.input) + list(m.graph.output):
        d = v.type.tensor_type.shape.dim[1]
        d.ClearField("dim_value")
        d.dim_param = "seq"
    return m


def single_product(seed=0, k=48, n=40, rows=6) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) * np.sqrt(2.0 / k)).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    g = helper.make_graph(nodes, "single", [helper.make_tensor_value_info("x", 1, [1, rows, k])],
                          [helper.make_tensor_value_info("y", 1, [1, rows, n])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    m.ir_version = 8
    return m


def kernels_param(kernels: str, monkeypatch):
    """``kernels`` "int8": the int8 kernels (skipped where this CPU's int8 sums are not exact);
    "float": their float32 form (``dnnl/int8_float.py``), forced on any CPU (``M.int8_form``).
    Returns the oracle: onnxruntime ORT_DISABLE_ALL where this CPU sums int8 exactly, else
    ``onnx.reference`` (onnxruntime's MatMulInteger sums u8 x s8 pairs in 16 bits there, and
    saturates)."""
    M.int8_form(monkeypatch, kernels)
    return M.ort_run if M.int8_kernels_exact() else M.exact_run


def dynamic_calls(cm, kernels: str = "int8") -> list:
    """The QLinearDynamic calls of ``cm``, each asserted to run a oneDNN VNNI int8 matmul (not a
    reference implementation; ``kernels`` "float": the float32 form's sgemm), counted in
    ``report.kernels``, none declined."""
    from fusegraph.runtime.backends.cpu.dnnl.int8_float import FloatDynamicLinear
    from fusegraph.runtime.backends.cpu.dnnl.linear_dynamic_int8 import DynamicInt8Linear
    calls = [c for c in cm._executor.binding.calls if c.node.op_type == "QLinearDynamic"]
    declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
    impls = cm.report.kernels["implementations"]
    used = collections.Counter()
    for c in calls:
        k = getattr(c.kernel, "kernel", c.kernel)
        k = getattr(k, "fast", k)
        assert c.node.name not in declined, f"{c.node.name} declined: {declined[c.node.name]}"
        if kernels == "float":
            assert isinstance(k, FloatDynamicLinear) and k.impl == "sgemm (float32 on dequantised int8)", k
        else:
            assert isinstance(k, DynamicInt8Linear), f"{c.node.name} runs {type(k).__name__}"
            assert M.int8_dot_products(k.impl), (c.node.name, k.impl)
        used[k.impl] += 1
    for impl, count in used.items():     # (on AMX, products too narrow for its tiles run VNNI kernels)
        assert impls.get(impl, 0) >= count, (impl, impls)
    return calls


def one_step(q: onnx.ModelProto, mmi_input: str, x_scale: float) -> np.ndarray:
    """Per output column of the MatMulInteger reading ``mmi_input``: how far its dequantised
    result moves when every element of its quantised input moves one step."""
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    mmi = next(n for n in q.graph.node if n.op_type == "MatMulInteger" and n.input[0] == mmi_input)
    by_out = {o: n for n in q.graph.node for o in n.output}
    cast = next(n for n in q.graph.node if n.op_type == "Cast" and n.input[0] == mmi.output[0])
    mul = next(n for n in q.graph.node if n.op_type == "Mul" and cast.output[0] in n.input)
    scales = by_out[next(i for i in mul.input if i != cast.output[0])]
    w_scale = next(inits[i] for i in scales.input if i in inits).astype(np.float64)
    wq = inits[mmi.input[1]].astype(np.float64) - inits[mmi.input[3]].astype(np.float64)
    return x_scale * np.abs(wq).sum(axis=0) * w_scale


@pytest.fixture(scope="module", params=[False, True], ids=["per_tensor", "per_channel"])
def block(request, tmp_path_factory):
    m = M.matmul_block()
    return m, quantize_dynamic(m, tmp_path_factory.mktemp("dyn"), "block", request.param)


def test_graph_has_one_op_per_product(block):
    """The three products are QLinearDynamic, reading three DynamicQuantizeLinear nodes; no
    MatMulInteger, Cast or scale Mul is left."""
    _, q = block
    cm = fg.compile(q, config=CFG)
    ops = collections.Counter(n.op_type for n in cm.graph.nodes)
    assert ops["QLinearDynamic"] == 3 and ops["DynamicQuantizeLinear"] == 3, ops
    assert not (ops["MatMulInteger"] or ops["Cast"] or ops["Mul"] or ops["MatMul"]), ops
    biased = [n for n in cm.graph.nodes if n.op_type == "QLinearDynamic" and len(n.inputs) == 6]
    assert len(biased) == 2, "the two products followed by a bias take it"


@pytest.mark.parametrize("kernels", ["int8", "float"])
def test_block_matches_onnxruntime_within_one_step(block, kernels, monkeypatch):
    """The block's output within ``one_step`` of its last product of onnxruntime ORT_DISABLE_ALL,
    with the last quantised input (bytes, scale, zero point) equal to the ONNX reference's
    DynamicQuantizeLinear of the float value fusegraph computed; the products ran on oneDNN's
    int8 matmul, or (``kernels`` "float") on sgemm over the integer values."""
    oracle = kernels_param(kernels, monkeypatch)
    fp32, q = block
    extra = ["s", "s_quantized", "s_scale", "s_zero_point"]
    qx = with_outputs(q, extra)
    cm = fg.compile(qx, config=CFG)
    assert len(dynamic_calls(cm, kernels)) == 3
    dql = ReferenceEvaluator(helper.make_model(helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dql",
        [helper.make_tensor_value_info("x", 1, None)],
        [helper.make_tensor_value_info(n, t, None) for n, t in (("y", 2), ("s", 1), ("z", 2))]),
        opset_imports=[helper.make_opsetid("", M.OPSET)]))
    for seed in SEEDS:
        feeds = M.feeds_for(fp32, seed)
        got = cm.run(feeds)
        y, s, s_q, s_scale, s_zp = (np.asarray(got[k]) for k in ["y"] + extra)
        ref_q, ref_scale, ref_zp = dql.run(None, {"x": s})
        assert s_q.dtype == np.uint8 and np.array_equal(s_q, ref_q)
        assert s_scale.dtype == np.float32 and s_scale.tobytes() == np.asarray(ref_scale, np.float32).tobytes()
        assert s_zp.dtype == np.uint8 and int(s_zp) == int(ref_zp)
        (ref,) = oracle(q, feeds)
        bound = one_step(q, "s_quantized", float(s_scale)) + 2.0 ** -22 * np.abs(ref)
        diff = np.abs(y.astype(np.float64) - ref)
        assert (diff <= bound).all(), f"seed {seed}: {float((diff - bound).max())} over the one-step bound"
        assert diff.mean() <= 1e-3 * bound.mean(), f"seed {seed}: mean error {diff.mean()}"


@pytest.mark.parametrize("kernels", ["int8", "float"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_single_product_to_float_rounding(tmp_path, per_channel, kernels, monkeypatch):
    """One product: the same quantised activation, so the output agrees with onnxruntime to
    float32 rounding (on the int8 kernels and on the float32 form, whose integer sums are
    exact at this K)."""
    oracle = kernels_param(kernels, monkeypatch)
    m = single_product()
    q = quantize_dynamic(m, tmp_path, "single", per_channel)
    cm = fg.compile(q, config=CFG)
    assert len(dynamic_calls(cm, kernels)) == 1
    b = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "b"))
    for seed in SEEDS:
        feeds = M.feeds_for(m, seed)
        (y,) = cm.run(feeds).values()
        (ref,) = oracle(q, feeds)
        assert np.all(np.abs(y - ref) <= 2.0 ** -22 * (np.abs(ref) + np.abs(b))), np.abs(y - ref).max()


@pytest.mark.parametrize("kernels", ["int8", "float"])
def test_rows_known_at_run_time(tmp_path, kernels, monkeypatch):
    """A block whose sequence axis is symbolic: one compile, a oneDNN int8 matmul per row count
    (the weight packed once; or sgemm at any row count, ``kernels`` "float"), each run within
    the one-step bound of onnxruntime."""
    oracle = kernels_param(kernels, monkeypatch)
    m = symbolic_rows(M.matmul_block())
    q = quantize_dynamic(m, tmp_path, "rows", True)
    qx = with_outputs(q, ["s_scale"])
    cm = fg.compile(qx, config=CFG)
    calls = dynamic_calls(cm, kernels)
    assert all(getattr(c.kernel, "_static", None) is None for c in calls), "rows are known at run time only"
    rng = np.random.default_rng(7)
    for rows in (1, 9, 70, 9):
        feeds = {"x": rng.standard_normal((1, rows, 32)).astype(np.float32)}
        got = cm.run(feeds)
        (ref,) = oracle(q, feeds)
        assert got["y"].shape == ref.shape
        bound = one_step(q, "s_quantized", float(got["s_scale"])) + 2.0 ** -22 * np.abs(ref)
        assert (np.abs(got["y"].astype(np.float64) - ref) <= bound).all(), rows


def test_dynamic_quantize_linear_at_ties():
    """Values on a rounding tie (``x / scale`` exactly k + 0.5) and at the range's ends
    quantise as the ONNX reference does, bit for bit, through the public API."""
    scale = np.float32(6.0) / np.float32(255)              # the scale of a range [-2, 4]
    ties = []
    for k in range(-80, 165):                               # x / scale exactly k + 0.5, where one exists
        x0 = np.float32((k + 0.5) * float(scale))
        for cand in (x0, np.nextafter(x0, np.float32(np.inf)), np.nextafter(x0, np.float32(-np.inf))):
            if np.float32(cand / scale) == np.float32(k + 0.5) and -2 < cand < 4:
                ties.append(cand)
                break
    x = np.concatenate([np.asarray(ties, np.float32), [np.float32(-2.0), np.float32(4.0)]])
    x = x.astype(np.float32).reshape(1, -1)
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dql",
                          [helper.make_tensor_value_info("x", 1, list(x.shape))],
                          [helper.make_tensor_value_info("y", 2, list(x.shape)),
                           helper.make_tensor_value_info("s", 1, []), helper.make_tensor_value_info("z", 2, [])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", M.OPSET)])
    ref = ReferenceEvaluator(model).run(None, {"x": x})
    ties = np.sum((x / ref[1]) - np.floor(x / ref[1]) == 0.5)
    assert ties > 50, "the input holds rounding ties"
    got = fg.compile(model, config=CFG).run({"x": x})
    assert np.array_equal(got["y"], ref[0])
    assert np.asarray(got["s"]).tobytes() == np.asarray(ref[1], np.float32).tobytes()
    assert int(got["z"]) == int(ref[2])


def test_not_matched_runs_as_before(tmp_path):
    """A MatMulInteger whose float32 cast is also a graph output keeps its own kernels: the pass
    counts the decline, ``report.kernels`` says why, and the outputs match onnxruntime."""
    m = single_product()
    q = with_outputs(quantize_dynamic(m, tmp_path, "single", False), ["m_output_quantized_cast_output"])
    cm = fg.compile(q, config=CFG)
    assert "QLinearDynamic" not in {n.op_type for n in cm.graph.nodes}
    stat = next(p for p in cm.report.passes if p.name == "dynamic_quant")
    assert stat.stats.get("declined", {}).get("dynamic_matmul") == 1, stat
    declined = {d["op"]: d["reason"] for d in cm.report.kernels["declined"]}
    if available():
        assert "dynamic_quant" in declined.get("MatMulInteger", ""), cm.report.kernels["declined"]
    feeds = M.feeds_for(m, 3)
    got = cm.run(feeds)
    ref = M.ort_run(q, feeds)
    for y, r in zip(got.values(), ref):
        assert np.all(np.abs(y - r) <= 2.0 ** -22 * np.abs(r)), np.abs(y - r).max()


@needs_int8_kernels
def test_fgm_round_trip(block, tmp_path):
    """The saved model loads with its packed int8 weights as stored (no reorder) and gives the
    same bytes."""
    fp32, q = block
    cm = fg.compile(q, config=CFG)
    feeds = M.feeds_for(fp32, 3)
    (y,) = cm.run(feeds).values()
    cm.save(str(tmp_path / "dyn.fgm"))
    loaded = fg.load(str(tmp_path / "dyn.fgm"))
    assert loaded.load_info.get("weight_reorders") == 0, loaded.load_info
    assert len(dynamic_calls(loaded)) == 3
    (y2,) = loaded.run(feeds).values()
    np.testing.assert_array_equal(y, y2)
