"""The CPU kernels made once for every shape of a model with symbolic dims: the weight product
with run-time rows (``dnnl/linear_runtime.py``: sgemm over the plain float32 weight at every
row count, or, for a decoder, the weight transposed with a matrix-vector product for few rows)
and the layer norms writing into planned memory (``layer_norm.py``), checked against torch
computing the same thing on its own."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from cpu_isa import BF16_ARITHMETIC
from fusegraph.ir import DType, Graph, Node, Value
from fusegraph.ops.registry import NodeContext
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.protocol import Decline
from fusegraph.runtime.backends.cpu.dnnl.blocked import check
from fusegraph.runtime.backends.cpu.dnnl.linear import SET_ALIASING_BYTES
from fusegraph.runtime.backends.cpu.dnnl.linear_runtime import COLUMN_MAJOR_MAX_N, GEMV_ROWS, runtime_linear_kernel
from fusegraph.runtime.backends.cpu.dnnl.primitive import Resources, create
from fusegraph.runtime.backends.cpu.dnnl.weights import WeightStore
from fusegraph.runtime.backends.cpu.layer_norm import layer_norm_kernel
from fusegraph.runtime.backends.cpu.workspace import Workspace

needs_dnnl = pytest.mark.skipif(not available(), reason="oneDNN is not loadable here")


def _linear_node(k: int, n: int, activation: str, bias: bool, trans_b: bool, rng) -> tuple[Node, torch.Tensor, torch.Tensor | None]:
    g = Graph("linear")
    x = Value("x", DType.FLOAT, ("rows", k))
    w = torch.from_numpy((rng.standard_normal((n, k) if trans_b else (k, n)) * (2 / k) ** 0.5).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if bias else None
    inputs = [x, g.add_constant("w", w)] + ([g.add_constant("b", b)] if bias else [])
    y = Value("y", DType.FLOAT, ("rows", n))
    node = Node("LinearAct", inputs, [y], {"activation": activation, "trans_b": int(trans_b)}, name="lin",
                domain="fusegraph")
    return node, w, b


def _want(x, w, b, activation, trans_b):
    y = x.double() @ (w.double().t() if trans_b else w.double())
    if b is not None:
        y = y + b.double()
    return {"none": y, "relu": torch.relu(y), "gelu": torch.nn.functional.gelu(y),
            "gelu_tanh": torch.nn.functional.gelu(y, approximate="tanh")}[activation].float()


@needs_dnnl
@pytest.mark.parametrize("one_row_steps", [False, True])
@pytest.mark.parametrize("activation,bias,trans_b,n", [("none", False, False, 200), ("gelu", True, True, 200),
                                                      ("relu", True, False, 200),
                                                      ("none", True, False, COLUMN_MAJOR_MAX_N + 8)])
def test_run_time_rows_match_torch_at_every_row_count(one_row_steps, activation, bias, trans_b, n):
    rng = np.random.default_rng(0)
    k = 96
    node, w, b = _linear_node(k, n, activation, bias, trans_b, rng)
    kernel = runtime_linear_kernel(NodeContext(node), WeightStore(), Resources(), True, one_row_steps)
    assert "sgemm" in kernel.impl                          # no code generated per row count
    assert ("W^T" in kernel.impl) == (one_row_steps and n <= COLUMN_MAJOR_MAX_N)
    for rows in (1, 2, 3, 7, 64, 65):
        x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
        out = torch.full((rows, n), float("nan"))        # whatever the slot held is overwritten
        got = kernel(x, out=out)
        assert got is out
        torch.testing.assert_close(got, _want(x, w, b, activation, trans_b), rtol=1e-4, atol=1e-4)


@needs_dnnl
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("one_row_steps", [False, True])
def test_the_fast_form_runs_its_activation_on_onednn_in_row_pieces(activation, one_row_steps, monkeypatch):
    """A guarded product's fast form (``exact`` False) runs its activation after sgemm as
    oneDNN's eltwise over the output, not as the torch activation: same numbers (finite
    inputs) as the float64 product and the formula, at one row and at counts run as several
    pieces (201 rows: 192, 8, 1), on primitives made once for the piece counts (a decoder's
    products fuse it into their matmul primitive above ``GEMV_ROWS``)."""
    from fusegraph.runtime.backends.cpu.dnnl import linear_runtime, rows_eltwise
    rng = np.random.default_rng(5)
    node, w, b = _linear_node(96, 200, activation, True, True, rng)
    kernel = runtime_linear_kernel(NodeContext(node), WeightStore(), Resources(), False, one_row_steps)

    def refused(_t):
        raise AssertionError("the torch activation ran")
    kernel._act = refused
    made = []
    for module in (linear_runtime, rows_eltwise):
        monkeypatch.setattr(module, "create", lambda what, f: made.append(what) or create(what, f))
    for rows in (1, 1, 2, 5, 201, 9, 200):
        x = torch.from_numpy(rng.standard_normal((rows, 96)).astype(np.float32))
        got = kernel(x, out=torch.full((rows, 200), float("nan")))
        torch.testing.assert_close(got, _want(x, w, b, activation, True), rtol=1e-4, atol=1e-4)
    # sgemm at every count: 201 as 192, 8, 1; 9 as 8, 1; 200 as 192, 8. A decoder's weight held
    # transposed: sgemm up to GEMV_ROWS, a matmul primitive with the activation fused above.
    # The count of 8 was made with the kernel (``rows_eltwise.PROBE_ROWS``: its implementation's name)
    pieces = {1, 2} if one_row_steps else {1, 2, 5, 192}
    assert made.count("eltwise") == len(pieces), made


@needs_dnnl
def test_an_exact_gelu_runs_on_onednn_unless_a_nan_or_inf_is_there():
    """The exact form's GELU after sgemm runs as oneDNN's eltwise where one max over the
    output finds no NaN and no +inf; where one is there, the op's own GELU runs (+inf stays
    +inf, NaN stays NaN, as ONNX's formula says), and the finite rows are the same."""
    rng = np.random.default_rng(6)
    node, w, b = _linear_node(96, 200, "gelu", True, True, rng)
    kernel = runtime_linear_kernel(NodeContext(node), WeightStore(), Resources(), True, False)
    ran = []
    torch_gelu = kernel._act
    kernel._act = lambda t: ran.append(t.shape[0]) or torch_gelu(t)
    for rows in (3, 201):
        x = torch.from_numpy(rng.standard_normal((rows, 96)).astype(np.float32))
        got = kernel(x, out=torch.full((rows, 200), float("nan")))
        torch.testing.assert_close(got, _want(x, w, b, "gelu", True), rtol=1e-4, atol=1e-4)
    assert ran == []
    x = torch.from_numpy(rng.standard_normal((5, 96)).astype(np.float32))
    x[1, 0], x[3, 0] = float("inf"), float("nan")
    got = kernel(x, out=torch.full((5, 200), 7.0))
    assert ran == [5]
    want = _want(x, w, b, "gelu", True)
    y = x.double() @ w.double().t() + b.double()
    assert torch.equal(torch.isposinf(got), torch.isposinf(y)) and torch.equal(got.isnan(), y.isnan() | want.isnan())
    torch.testing.assert_close(got[[0, 2, 4]], want[[0, 2, 4]], rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_products_of_one_configuration_share_their_row_counts():
    """A decoder's prompt rows run a matmul primitive per row count: the layers' products of one
    configuration make one between them, and each still multiplies by its own weight and adds
    its own bias (the shared call's memories are pointed at them); another configuration
    (another activation) shares nothing with them."""
    rng = np.random.default_rng(3)
    resources, store = Resources(), WeightStore()
    made = []
    for i in range(3):
        node, w, b = _linear_node(64, 96, "relu", True, True, rng)
        node.inputs[1].name, node.inputs[2].name = f"w{i}", f"b{i}"
        made.append((runtime_linear_kernel(NodeContext(node), store, resources, True, True), w, b, "relu"))
    node, w, b = _linear_node(64, 96, "none", True, True, rng)
    other = (runtime_linear_kernel(NodeContext(node), store, resources, True, True), w, b, "none")
    assert made[0][0]._calls is made[2][0]._calls and other[0]._calls is not made[0][0]._calls
    for rows in (GEMV_ROWS + 1, 9, GEMV_ROWS + 1, 33):
        for kernel, w, b, activation in made[::-1] + [other] if rows % 2 else [other] + made:
            x = torch.from_numpy(rng.standard_normal((rows, 64)).astype(np.float32))
            got = kernel(x, out=torch.full((rows, 96), float("nan")))
            torch.testing.assert_close(got, _want(x, w, b, activation, True), rtol=1e-4, atol=1e-4)
    assert list(made[1][0]._calls[threading.get_ident()].rows) == [9, GEMV_ROWS + 1, 33]   # one per row count


def _bf16_node(out: DType, rng) -> tuple[Node, torch.Tensor, torch.Tensor]:
    g = Graph("linear")
    w = torch.from_numpy((rng.standard_normal((64, 48)) * 0.2).astype(np.float32)).to(torch.bfloat16)
    b = torch.from_numpy(rng.standard_normal(48).astype(np.float32))
    node = Node("LinearAct", [Value("x", DType.BFLOAT16, ("rows", 64)), g.add_constant("w", w),
                              g.add_constant("b", b)], [Value("y", out, ("rows", 48))],
                {"activation": "relu", "trans_b": 0}, name="lin", domain="fusegraph")
    return node, w, b


@needs_dnnl
@pytest.mark.skipif(not BF16_ARITHMETIC, reason="no bfloat16 arithmetic on this CPU")
def test_a_bfloat16_product_with_a_float32_output_runs_on_onednn_at_every_row_count():
    """bfloat16 operands written as float32 (a Cast folded into the product): one oneDNN
    matmul per row count with a float32 destination, not the op's own kernel; each row count's
    result is the float64 product of the same bfloat16 operands, rounded once."""
    rng = np.random.default_rng(6)
    node, w, b = _bf16_node(DType.FLOAT, rng)
    kernel = runtime_linear_kernel(NodeContext(node), WeightStore(), Resources(), True, False)
    assert not isinstance(kernel, Decline) and kernel.impl.startswith("brg"), kernel
    for rows in (1, 5, 64, 5):
        x = torch.from_numpy(rng.standard_normal((rows, 64)).astype(np.float32)).to(torch.bfloat16)
        got = kernel(x, out=torch.full((rows, 48), float("nan")))
        assert got.dtype == torch.float32
        want = torch.relu(x.double() @ w.double() + b.double())
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@needs_dnnl
def test_a_bfloat16_output_without_bfloat16_arithmetic_declines(monkeypatch):
    """Where the CPU computes bfloat16 products in float32, a bfloat16 output is not what the
    matmul writes: the node declines with that reason (before, it was bound and refused its
    output at run time)."""
    from fusegraph.runtime.backends.cpu.dnnl import linear_runtime
    monkeypatch.setattr(linear_runtime, "compute_dtype", lambda stored: torch.float32)
    node, _, _ = _bf16_node(DType.BFLOAT16, np.random.default_rng(7))
    got = runtime_linear_kernel(NodeContext(node), WeightStore(), Resources(), True, False)
    assert isinstance(got, Decline) and "no bfloat16 arithmetic" in got.reason


@needs_dnnl
@pytest.mark.parametrize("one_row_steps,rows", [(True, GEMV_ROWS), (False, GEMV_ROWS), (False, 67)])
def test_the_sgemm_product_keeps_nan_and_inf_of_its_input(one_row_steps, rows):
    rng = np.random.default_rng(1)
    node, w, b = _linear_node(64, 48, "none", True, False, rng)
    kernel = runtime_linear_kernel(NodeContext(node), WeightStore(), Resources(), True, one_row_steps)
    x = torch.from_numpy(rng.standard_normal((rows, 64)).astype(np.float32))
    x[0, 3] = float("nan")
    x[rows - 1, 5] = float("inf")
    got = kernel(x, out=torch.zeros(rows, 48))
    want = _want(x, w, b, "none", False)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))


@needs_dnnl
def test_a_decoder_holds_its_product_weights_plain_and_once():
    """The weight of a one-row product is the store's only form of it (or the graph's own
    tensor): no blocked copy beside it. A layer's product (up to ``COLUMN_MAJOR_MAX_N``
    columns) holds it N x K, each column of W one contiguous row; a wider one K x N (a large
    one copied into 2 MiB pages where the kernel has them, its graph tensor then released)."""
    rng = np.random.default_rng(2)
    node_t, w_t, _ = _linear_node(64, 80, "none", False, True, rng)          # given N x K
    store_t = WeightStore()
    kernel = runtime_linear_kernel(NodeContext(node_t), store_t, Resources(), True, True)
    assert kernel.by_columns and kernel._packed.data_ptr() == w_t.data_ptr() and not store_t.forms
    node, w, _ = _linear_node(64, 80, "none", False, False, rng)              # given K x N
    store = WeightStore()
    runtime_linear_kernel(NodeContext(node), store, Resources(), True, True)
    (form,) = store.forms["w"]
    assert form.data.numel() == w.numel() * 4 and form.desc["strides"] == [1, 64]
    node_w, w_w, _ = _linear_node(64, COLUMN_MAJOR_MAX_N + 8, "none", False, False, rng)
    store_w = WeightStore()
    wide = runtime_linear_kernel(NodeContext(node_w), store_w, Resources(), True, True)
    assert not wide.by_columns
    if store_w.buffers.takes(w_w.numel() * 4):    # its only reader: copied once into 2 MiB pages
        (form,) = store_w.forms["w"]
        assert wide._packed.data_ptr() == form.data.data_ptr() and form.desc["strides"] == [COLUMN_MAJOR_MAX_N + 8, 1]
        assert torch.equal(form.data.view(torch.float32).view(w_w.shape), w_w)
    else:
        assert wide._packed.data_ptr() == w_w.data_ptr() and not store_w.forms


@needs_dnnl
def test_an_encoder_holds_its_float32_product_weights_plain_and_once():
    """Run-time rows of any count (no decoder): the weight is held K x N, the graph's own
    tensor where it was given so, else one transposed copy, and nothing blocked beside it."""
    rng = np.random.default_rng(3)
    node, w, _ = _linear_node(64, 80, "relu", True, False, rng)
    store = WeightStore()
    kernel = runtime_linear_kernel(NodeContext(node), store, Resources(), True, False)
    assert not kernel.by_columns and kernel._packed.data_ptr() == w.data_ptr() and not store.forms
    node_t, w_t, _ = _linear_node(64, 80, "none", False, True, rng)
    store_t = WeightStore()
    runtime_linear_kernel(NodeContext(node_t), store_t, Resources(), True, False)
    (form,) = store_t.forms["w"]
    assert form.data.numel() == w_t.numel() * 4 and form.desc["strides"] == [80, 1]


@needs_dnnl
@pytest.mark.parametrize("n,longer", [(256, True), (768, True), (200, False), (260, False)])
def test_a_weight_whose_rows_fall_into_few_cache_sets_is_held_one_line_longer(n, longer):
    """sgemm over a K x N weight whose rows are a multiple of ``SET_ALIASING_BYTES`` walks rows
    that share a few sets of the L1 cache (slower at tens of rows): such a weight is held with
    each row one 64-byte line longer, the store's only form of it, read back exactly, and the
    product is the float64 one at every row count; other widths stay as they are."""
    rng = np.random.default_rng(4)
    k = 64
    node, w, b = _linear_node(k, n, "relu", True, False, rng)
    store = WeightStore()
    kernel = runtime_linear_kernel(NodeContext(node), store, Resources(), True, False)
    ld = n + 16 if longer else n
    assert kernel.ldb == ld and ((n * 4) % SET_ALIASING_BYTES == 0) == longer
    if longer:
        (form,) = store.forms["w"]
        assert form.desc["strides"] == [ld, 1] and form.data.numel() == k * ld * 4
        assert kernel._packed.data_ptr() == form.data.data_ptr()
        assert torch.equal(store.plain("w", torch.empty(k, n, device="meta")), w)
        assert check(form.desc, form.data.numel()) is None
    else:
        assert kernel._packed.data_ptr() == w.data_ptr() and not store.forms
    for rows in (1, 3, 64, 65):
        x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
        got = kernel(x, out=torch.full((rows, n), float("nan")))
        torch.testing.assert_close(got, _want(x, w, b, "relu", False), rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_a_saved_encoder_loads_its_longer_rows_as_stored(tmp_path, monkeypatch):
    """A model with run-time rows whose product weights are held with longer rows saves those
    forms and loads them as they are (no reorder), with the compiled model's numbers, which are
    onnxruntime ORT_DISABLE_ALL's at several lengths."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import fusegraph as fg
    from fusegraph.runtime.backends.cpu.dnnl import weights
    from oracle import assert_outputs_close, ort_run
    rng = np.random.default_rng(8)
    w1 = (rng.standard_normal((64, 256)) * (2 / 64) ** 0.5).astype(np.float32)
    w2 = (rng.standard_normal((256, 64)) * (2 / 256) ** 0.5).astype(np.float32)
    b1 = rng.standard_normal(256).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 64])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    compiled = fg.compile(model, fg.Config(threads=2))
    forms = compiled._executor.backend.store.forms
    assert forms and all(p.desc["strides"][0] == p.desc["dims"][1] + 16 for f in forms.values() for p in f)
    path = tmp_path / "encoder.fgm"
    compiled.save(path)
    reorders = []
    real = weights.reorder
    monkeypatch.setattr(weights, "reorder", lambda *a: reorders.append(1) or real(*a))
    loaded = fg.load(path)
    assert loaded.load_info["weight_reorders"] == 0 and not reorders
    for seq in (5, 37, 5):
        feeds = {"x": rng.standard_normal((1, seq, 64)).astype(np.float32)}
        want = ort_run(model, feeds)
        got = compiled.run(feeds)
        assert_outputs_close(got, want)
        for name, value in loaded.run(feeds).items():
            np.testing.assert_array_equal(value, got[name])
    loaded.close()


def _layer_norm_node(skip: bool, both: bool, d: int, rng):
    g = Graph("ln")
    x = Value("x", DType.FLOAT, ("rows", d))
    inputs = [x] + ([Value("r", DType.FLOAT, ("rows", d))] if skip else [])
    gamma = torch.from_numpy(rng.standard_normal(d).astype(np.float32))
    beta = torch.from_numpy(rng.standard_normal(d).astype(np.float32))
    inputs += [g.add_constant("gamma", gamma), g.add_constant("beta", beta)]
    outs = [Value("y", DType.FLOAT, ("rows", d))] + ([Value("s", DType.FLOAT, ("rows", d))] if both else [])
    node = Node("SkipLayerNorm" if skip else "LayerNorm", inputs, outs, {"epsilon": 1e-5}, name="ln",
                domain="fusegraph")
    return node, gamma, beta


@pytest.mark.parametrize("skip,both", [(False, False), (True, False), (True, True)])
def test_layer_norm_in_planned_memory_matches_torch_bit_for_bit(skip, both):
    """Normalised in place over the sum when the node gives no residual output: bit for bit
    the out-of-place result, at any row count."""
    rng = np.random.default_rng(3)
    d = 48
    node, gamma, beta = _layer_norm_node(skip, both, d, rng)
    kernel = layer_norm_kernel(NodeContext(node), Workspace())
    for rows in (1, 5, 33):
        a = torch.from_numpy(rng.standard_normal((rows, d)).astype(np.float32))
        r = torch.from_numpy(rng.standard_normal((rows, d)).astype(np.float32))
        s = a + r if skip else a
        want = torch.nn.functional.layer_norm(s, [d], gamma, beta, 1e-5)
        if not skip:
            got = kernel(a, out=torch.empty(rows, d))
        elif both:
            got, total = kernel(a, r, out=(torch.empty(rows, d), torch.empty(rows, d)))
            assert torch.equal(total, s)
        else:
            got = kernel(a, r, out=torch.empty(rows, d))
        assert torch.equal(got, want)


@pytest.mark.parametrize("skip", [False, True])
def test_layer_norm_recomputes_a_non_finite_row_in_float64(skip):
    """A row whose float32 statistics overflow is computed again in float64 (finite where the
    exact result is), and a row with a NaN stays NaN; also for the skip form that normalises
    over the sum's own bytes (the float64 pass reads the sum before it is overwritten)."""
    rng = np.random.default_rng(4)
    d = 16
    node, gamma, beta = _layer_norm_node(skip, False, d, rng)
    kernel = layer_norm_kernel(NodeContext(node), Workspace())
    x = torch.from_numpy(rng.standard_normal((3, d)).astype(np.float32))
    x[0] = torch.linspace(-3e37, 3e37, d, dtype=torch.float64).float()
    x[1, 2] = float("nan")
    if skip:
        r = torch.from_numpy(rng.standard_normal((3, d)).astype(np.float32))
        got = kernel(x, r, out=torch.empty(3, d))
        x = x + r
    else:
        got = kernel(x, out=torch.empty(3, d))
    want = torch.nn.functional.layer_norm(x.double(), [d], gamma.double(), beta.double(), 1e-5).float()
    assert torch.isfinite(got[0]).all() and torch.isnan(got[1]).all()
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5)
