"""Layer norms whose rows are known only at run time (``dnnl/layernorm_runtime.py``: a oneDNN
layer normalisation primitive per row count): a model with a symbolic sequence dim holding a
LayerNorm and residual Add + LayerNorm pairs (fused into SkipLayerNorm, with and without the
sum as a second output) against onnxruntime at several lengths, one and unseen ones among
them; NaN, Inf and a row whose float32 sums overflow against a float64 computation of the same
graph; and the kernel itself (bfloat16 output, the bound on the primitives it keeps)."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T, helper as H, numpy_helper

import fusegraph as fg
from cpu_isa import AVX512, BF16_ARITHMETIC
from fusegraph.ir import DType, Graph, Node, Value
from fusegraph.ops.registry import NodeContext, opdef_for
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl import layernorm_runtime
from fusegraph.runtime.backends.cpu.dnnl.layernorm_runtime import runtime_layer_norm_kernel
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources
from oracle import assert_outputs_close, ort_run

needs_dnnl = pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")
D = 64
EPS = 1e-5
NORMS = ("LayerNorm", "SkipLayerNorm")


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {f"w{i}": (rng.standard_normal((D, D)) * (2 / D) ** 0.5).astype(np.float32) for i in (1, 2)}
    w["c1"] = (rng.standard_normal(D) * 0.1).astype(np.float32)
    for i in range(3):
        w[f"g{i}"] = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
        w[f"b{i}"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
    return w


def _model(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``y2 = LN(m2 + s1)`` with ``s1 = m1 + x``, ``m1 = LN(x) @ w1 + c1``, ``m2 = LN(s1) @ w2``:
    a plain LayerNorm, a SkipLayerNorm whose sum ``s1`` is read again (both outputs) and one
    whose sum is not (normalised over its own bytes). ``x`` is ``[1, L, D]``, L symbolic."""
    def ln(v, i, out):
        return H.make_node("LayerNormalization", [v, f"g{i}", f"b{i}"], [out], axis=-1, epsilon=EPS)
    nodes = [ln("x", 0, "h"), H.make_node("MatMul", ["h", "w1"], ["p1"]), H.make_node("Add", ["p1", "c1"], ["m1"]),
             H.make_node("Add", ["m1", "x"], ["s1"]), ln("s1", 1, "y1"), H.make_node("MatMul", ["y1", "w2"], ["m2"]),
             H.make_node("Add", ["m2", "s1"], ["s2"]), ln("s2", 2, "y2")]
    graph = H.make_graph(nodes, "dynamic_norms", [H.make_tensor_value_info("x", T.FLOAT, [1, "L", D])],
                         [H.make_tensor_value_info("y2", T.FLOAT, [1, "L", D])],
                         [numpy_helper.from_array(v, k) for k, v in w.items()])
    return H.make_model(graph, opset_imports=[H.make_opsetid("", 17)])


def _float64(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """The model computed in float64 with numpy (NaN / Inf as the arithmetic gives them)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}

    def ln(v, i):
        mean = v.mean(-1, keepdims=True)
        var = ((v - mean) ** 2).mean(-1, keepdims=True)
        return (v - mean) / np.sqrt(var + EPS) * w[f"g{i}"] + w[f"b{i}"]
    with np.errstate(invalid="ignore", over="ignore"):
        x = x.astype(np.float64)
        s1 = ln(x, 0) @ w["w1"] + w["c1"] + x
        return ln(ln(s1, 1) @ w["w2"] + s1, 2)


def _norm_kernels(model) -> dict[str, object]:
    return {c.node.name: c.kernel for c in model._executor.binding.calls if c.node.op_type in NORMS}


@needs_dnnl
def test_a_dynamic_model_runs_its_norms_on_onednn_at_every_length():
    w = _weights()
    m = _model(w)
    model = fg.compile(m)
    assert model.plan.symbolic
    rng = np.random.default_rng(1)
    for length in (1, 7, 64, 1, 200, 13, 2):          # a length seen before, new ones, one row
        feeds = {"x": rng.standard_normal((1, length, D)).astype(np.float32)}
        assert_outputs_close(model.run(feeds), ort_run(m, feeds), rtol=1e-4)
    kernels = _norm_kernels(model)
    ops = sorted(c.node.op_type for c in model._executor.binding.calls if c.node.op_type in NORMS)
    assert ops == ["LayerNorm", "SkipLayerNorm", "SkipLayerNorm"], ops
    both = [c for c in model._executor.binding.calls if c.node.op_type == "SkipLayerNorm" and len(c.node.outputs) == 2]
    assert len(both) == 1, "one SkipLayerNorm gives its sum as a second output"
    impls = {name: getattr(k, "impl", "portable") for name, k in kernels.items()}
    assert all(i != "portable" for i in impls.values()), impls
    if AVX512:                     # oneDNN's JIT layer normalisation, counted in the report
        assert all(i.startswith("jit") for i in impls.values()), impls
        counted = model.report.kernels["implementations"]
        assert sum(n for k, n in counted.items() if k.startswith("jit")) >= 3, counted
    declined = {d["node"] for d in model.report.kernels["declined"]}
    assert not declined & set(kernels), declined


@needs_dnnl
def test_a_static_model_keeps_its_static_kernel():
    """A compile of one shape runs the static oneDNN kernel (``dnnl/layernorm.py``), not the
    run-time one."""
    m = _model(_weights())
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 9
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 9
    model = fg.compile(m)
    kernels = _norm_kernels(model)
    assert len(kernels) == 3
    for k in kernels.values():
        inner = getattr(k, "fast", k)                  # a guarded node's fast kernel
        assert not isinstance(inner, layernorm_runtime.RuntimeLayerNorm)
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 9, D)).astype(np.float32)}
    assert_outputs_close(model.run(feeds), ort_run(m, feeds), rtol=1e-4)


@needs_dnnl
@pytest.mark.parametrize("static", [False, True])
def test_nan_inf_and_overflowing_rows_stay_exact(static):
    """A row holding a NaN, one holding +-Inf: NaN rows, as float64 arithmetic gives; a row
    of values near 1e37 (its float32 sums of squares overflow, in the plain LayerNorm and in
    both SkipLayerNorm forms) is recomputed in float64: finite, and that row's normalisation.
    The same for a compile of one shape (``dnnl/layernorm.py``), where oneDNN's variance of
    such a row overflows and the row would come out as ``beta``, finite."""
    w = _weights(3)
    rng = np.random.default_rng(4)
    for length in (1, 6, 40):
        m = _model(w)
        if static:
            m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = length
            m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = length
        model = fg.compile(m)
        x = rng.standard_normal((1, length, D)).astype(np.float32)
        row = np.linspace(-3e37, 3e37, D, dtype=np.float64).astype(np.float32)
        special = {0: "overflow"} if length == 1 else {0: "nan", 2: "inf", length - 1: "overflow"}
        for r, kind in special.items():
            if kind == "nan":
                x[0, r, 5] = np.nan
            elif kind == "inf":
                x[0, r, 1], x[0, r, 9] = np.inf, -np.inf
            else:
                x[0, r] = row
        got = model.run({"x": x})["y2"]
        want = _float64(x, w)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        assert finite[0, [r for r, k in special.items() if k == "overflow"]].all()
        np.testing.assert_allclose(got[finite], want[finite].astype(np.float32), rtol=1e-4, atol=1e-4)
        if not static:
            assert model.run({"x": x[:, :1] * 0 + 1})["y2"].shape == (1, 1, D)    # and back to ordinary rows


def _node(op: str, both: bool = False, out: DType = DType.FLOAT) -> tuple[Node, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(5)
    g = Graph("ln")
    gamma = torch.from_numpy((1 + 0.2 * rng.standard_normal(D)).astype(np.float32))
    beta = torch.from_numpy((0.1 * rng.standard_normal(D)).astype(np.float32))
    data = [Value("a", DType.FLOAT, ("rows", D))] + ([Value("b", DType.FLOAT, ("rows", D))] if op == "SkipLayerNorm" else [])
    outs = [Value("y", out, ("rows", D))] + ([Value("s", DType.FLOAT, ("rows", D))] if both else [])
    attrs = {"epsilon": EPS} | ({"out_dtype": int(out)} if out != DType.FLOAT else {})
    node = Node(op, data + [g.add_constant("gamma", gamma), g.add_constant("beta", beta)], outs, attrs,
                name="ln", domain="fusegraph")
    return node, gamma, beta


@needs_dnnl
def test_the_skip_form_over_its_own_bytes_recomputes_from_its_inputs():
    """One output: the sum is normalised in place, so an overflowing row is computed again
    from ``a`` and ``b``, not from the bytes the primitive overwrote."""
    node, gamma, beta = _node("SkipLayerNorm")
    kernel = runtime_layer_norm_kernel(NodeContext(node), opdef_for(node), Resources(), True)
    a = torch.randn(3, D)
    b = torch.randn(3, D)
    a[1] = torch.linspace(-3e37, 3e37, D, dtype=torch.float64).float()
    y = kernel(a, b, gamma, beta, out=torch.full((3, D), float("nan")))
    want = torch.nn.functional.layer_norm((a + b).double(), [D], gamma.double(), beta.double(), EPS)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


@needs_dnnl
@pytest.mark.skipif(not BF16_ARITHMETIC, reason="oneDNN has no bfloat16 kernels on this CPU")
def test_a_bfloat16_output_from_its_own_buffer_is_rounded_once():
    node, gamma, beta = _node("SkipLayerNorm", both=True, out=DType.BFLOAT16)
    kernel = runtime_layer_norm_kernel(NodeContext(node), opdef_for(node), Resources(), True)
    for rows in (1, 5, 70):
        a, b = torch.randn(rows, D), torch.randn(rows, D)
        y, s = kernel(a, b, gamma, beta, out=(torch.empty(rows, D, dtype=torch.bfloat16), torch.empty(rows, D)))
        assert torch.equal(s, a + b)
        want = torch.nn.functional.layer_norm((a + b).double(), [D], gamma.double(), beta.double(), EPS)
        torch.testing.assert_close(y.double(), want, rtol=8e-3, atol=8e-3)    # one bfloat16 rounding
    over_sum, _, _ = _node("SkipLayerNorm", both=False, out=DType.BFLOAT16)
    declined = runtime_layer_norm_kernel(NodeContext(over_sum), opdef_for(over_sum), Resources(), True)
    assert not isinstance(declined, layernorm_runtime.RuntimeLayerNorm) and "bfloat16" in declined.reason


@needs_dnnl
def test_the_primitives_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(layernorm_runtime, "ROWS_KEPT", 3)
    node, gamma, beta = _node("LayerNorm")
    kernel = runtime_layer_norm_kernel(NodeContext(node), opdef_for(node), Resources(), True)
    for rows in (1, 2, 3, 4, 5, 2, 9):
        x = torch.randn(rows, D)
        y = kernel(x, gamma, beta, out=torch.empty(rows, D))
        torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, [D], gamma, beta, EPS), rtol=1e-4, atol=1e-4)
        assert len(kernel._calls[threading.get_ident()].rows) <= 3
    assert list(kernel._calls[threading.get_ident()].rows) == [2, 8, 1]     # the most recently used pieces (9: 8, 1)


@needs_dnnl
@pytest.mark.parametrize("exact", [True, False])
def test_every_row_count_runs_on_a_fixed_set_of_primitives(exact, monkeypatch):
    """Traffic of every length from 1 to 1100 rows makes primitives only for the 30 piece
    counts of ``row_pieces`` (201 rows: 192, 8 and 1), not one per length; each length's rows
    are normalised as torch's layer_norm does them, including a row past a piece's end that
    holds a NaN (exact: that row only is NaN; the check sums the variances of every piece)."""
    node, gamma, beta = _node("LayerNorm")
    kernel = runtime_layer_norm_kernel(NodeContext(node), opdef_for(node), Resources(), exact)
    made = []
    make = kernel.make
    monkeypatch.setattr(kernel, "make", lambda rows: made.append(rows) or make(rows))
    rng = np.random.default_rng(5)
    for rows in [*range(1, 130), 201, 384, 1025, 1100, *rng.integers(130, 1024, 40).tolist()]:
        x = torch.from_numpy(rng.standard_normal((rows, D)).astype(np.float32))
        if exact and rows > 9:
            x[9, 3] = float("nan")               # in the second piece of 10..15 rows, in the first past 16
        y = kernel(x, gamma, beta, out=torch.full((rows, D), 7.0))
        want = torch.nn.functional.layer_norm(x.double(), [D], gamma.double(), beta.double(), EPS).float()
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert len(made) == len(set(made)) <= 30, sorted(made)
    assert {192, 8, 1} <= set(made) and 201 not in made and 1100 not in made


@needs_dnnl
@pytest.mark.parametrize("exact", [True, False])
def test_layer_norms_of_one_configuration_share_their_row_counts(exact):
    """The layers of a model make one primitive per never-seen row count between them, not
    one each; every node still normalises with its own gamma and beta (the shared call's
    parameter memories are pointed at them), in either order, on another thread too; a node
    of another epsilon shares nothing with them."""
    resources = Resources()
    nodes = []
    for seed in (1, 2, 3):
        node, _, _ = _node("SkipLayerNorm", both=True)
        rng = np.random.default_rng(seed)
        gamma = torch.from_numpy((1 + 0.3 * rng.standard_normal(D)).astype(np.float32))
        beta = torch.from_numpy((0.2 * rng.standard_normal(D)).astype(np.float32))
        node.inputs[2].const, node.inputs[3].const = gamma, beta
        nodes.append((runtime_layer_norm_kernel(NodeContext(node), opdef_for(node), resources, exact), gamma, beta))
    other, g_other, b_other = _node("LayerNorm")
    other.attrs["epsilon"] = 1e-3
    other_kernel = runtime_layer_norm_kernel(NodeContext(other), opdef_for(other), resources, exact)
    assert nodes[0][0]._calls is nodes[2][0]._calls and other_kernel._calls is not nodes[0][0]._calls

    def run_all(rows_list):
        for rows in rows_list:
            for kernel, gamma, beta in nodes[::-1] if rows % 2 else nodes:
                a, b = torch.randn(rows, D), torch.randn(rows, D)
                y, s = kernel(a, b, gamma, beta, out=(torch.empty(rows, D), torch.empty(rows, D)))
                torch.testing.assert_close(s, a + b)
                torch.testing.assert_close(y, torch.nn.functional.layer_norm(a + b, [D], gamma, beta, EPS),
                                           rtol=1e-4, atol=1e-4)
            x = torch.randn(rows, D)
            y = other_kernel(x, g_other, b_other, out=torch.empty(rows, D))
            torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, [D], g_other, b_other, 1e-3),
                                       rtol=1e-4, atol=1e-4)

    run_all([7, 12, 7, 30])
    assert list(nodes[1][0]._calls[threading.get_ident()].rows) == [8, 4, 7, 24, 6]   # one call per piece count (12: 8, 4)
    failed = []

    def on_another_thread():
        try:
            run_all([12, 5])
        except Exception as exc:  # noqa: BLE001 - reported below
            failed.append(exc)
    worker = threading.Thread(target=on_another_thread)
    worker.start()
    worker.join()
    assert not failed, failed
    assert len(nodes[0][0]._calls) == 2                                    # the other thread: its own calls
