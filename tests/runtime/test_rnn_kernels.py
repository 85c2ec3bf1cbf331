"""Recurrent nodes on oneDNN's recurrent primitives (``runtime/backends/cpu/dnnl/rnn.py``):
LSTM (as ``fusegraph::LSTM``, its weights in oneDNN's gate order), GRU (both
``linear_before_reset`` forms) and RNN, checked against onnxruntime ``ORT_DISABLE_ALL`` and
``onnx.reference`` at rtol 1e-4, and checked to have run as one oneDNN primitive each (an
``RnnKernel``, no decline; AVX-512: LSTM and RNN on the brgemm implementation), so no test
here passes on the portable fallback.

Covered: forward / reverse / bidirectional, with and without initial states (graph inputs or
constants), batch 1 and 3, bias absent, peepholes, batch-major ``layout`` 1, a constant
full-length ``sequence_lens``, outputs left off, a sequence length and batch known at run time
only (a primitive per shape); NaN and infinities as ONNX's equations give
them (onnx.reference: onnxruntime's own LSTM / GRU map a NaN input to numbers); the forms
torch exports (a 2-layer LSTM, a bidirectional GRU with its Transposes) end to end; the nodes
oneDNN cannot take declining with their reason while their numbers stay right.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.rnn import RnnKernel
from cpu_isa import AVX512, BF16_ARITHMETIC
from oracle import assert_outputs_close, ort_run

sys.path.insert(0, str(Path(__file__).parents[1]))
from recurrent_models import recurrent_model, torch_recurrent_onnx  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")

CFG = fg.Config(threads=2, thread_policy="fixed")   # the kernels inspected are the ones that run, busy machine or not
RECURRENT = ("LSTM", "GRU", "RNN")


def reference(model, feeds) -> dict:
    from onnx.reference import ReferenceEvaluator
    return dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))


def rnn_calls(cm) -> list:
    """The recurrent calls of ``cm``: at least one, each an ``RnnKernel`` no family declined,
    its implementation counted in the report (brgemm for LSTM / RNN on AVX-512)."""
    calls = [c for c in cm._executor.binding.calls if c.node.op_type in RECURRENT]
    assert calls
    declined = {d["node"]: d["reason"] for d in cm.report.kernels["declined"]}
    impls = cm.report.kernels["implementations"]
    for c in calls:
        assert c.node.name not in declined, declined[c.node.name]
        assert isinstance(c.kernel, RnnKernel), type(c.kernel).__name__
        assert impls.get(c.kernel.impl, 0) >= 1, (c.kernel.impl, impls)
        if AVX512 and c.node.op_type != "GRU":      # oneDNN 3.2 runs GRU on its GEMM-based "ref" cell
            assert c.kernel.impl.startswith("brgemm"), c.kernel.impl
    return calls


def run_both(model, feeds, config=CFG):
    cm = fg.compile(model, config)
    got = cm.run(feeds)
    return cm, got


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("initial", [True, False])
@pytest.mark.parametrize("batch", [1, 3])
def test_lstm_gru(op, direction, initial, batch):
    model, feeds = recurrent_model(op, batch=batch, direction=direction, initial=initial,
                                   **({"linear_before_reset": 1} if op == "GRU" else {}))
    cm, got = run_both(model, feeds)
    (call,) = rnn_calls(cm)
    assert call.out is not None, "the kernel writes into its planned slots"
    assert_outputs_close(got, ort_run(model, feeds))
    assert_outputs_close(got, reference(model, feeds))


@pytest.mark.parametrize("op,attrs", [("LSTM", {}), ("GRU", {"linear_before_reset": 0}),
                                      ("GRU", {"linear_before_reset": 1}), ("RNN", {}),
                                      ("RNN", {"activations": ["Sigmoid"]})])
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_cells_and_directions(op, attrs, direction):
    if op == "RNN" and direction == "bidirectional" and "activations" in attrs:
        attrs = {"activations": attrs["activations"] * 2}      # onnxruntime wants one per direction
    model, feeds = recurrent_model(op, batch=3, direction=direction, **attrs)
    cm, got = run_both(model, feeds)
    rnn_calls(cm)
    assert_outputs_close(got, ort_run(model, feeds))


@pytest.mark.parametrize("case", ["no_bias", "peepholes", "const_initial", "full_sequence_lens", "y_only",
                                  "y_and_h"])
def test_optional_inputs_and_outputs(case):
    kw = {"no_bias": dict(bias=False), "peepholes": dict(peepholes=True),
          "const_initial": dict(const_initial=True), "full_sequence_lens": dict(seq_lens=[5, 5, 5]),
          "y_only": dict(outputs=1, initial=False), "y_and_h": dict(outputs=2)}[case]
    model, feeds = recurrent_model("LSTM", direction="bidirectional", **kw)
    cm, got = run_both(model, feeds)
    rnn_calls(cm)
    assert_outputs_close(got, ort_run(model, feeds))
    assert_outputs_close(got, reference(model, feeds))


@pytest.mark.parametrize("op,direction", [("LSTM", "bidirectional"), ("GRU", "reverse"), ("LSTM", "forward")])
def test_batch_major_layout(op, direction):
    """``layout`` 1 (onnxruntime refuses it: onnx.reference is the oracle)."""
    model, feeds = recurrent_model(op, direction=direction, layout=1, batch=3)
    cm, got = run_both(model, feeds)
    rnn_calls(cm)
    assert_outputs_close(got, reference(model, feeds))


@pytest.mark.parametrize("op,attrs", [("LSTM", {}), ("GRU", {"linear_before_reset": 1}), ("GRU", {}), ("RNN", {})])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 3e38])
def test_nan_and_infinities_follow_the_equations(op, attrs, value):
    """A NaN in one step of one sequence makes that sequence's later states NaN (and nothing
    else), as the ONNX equations and onnx.reference say; an infinite input saturates the gates.
    The op's own kernel gives the same, element for element."""
    model, feeds = recurrent_model(op, steps=6, batch=3, direction="bidirectional", **attrs)
    feeds["X"][2, 1, 1] = value
    cm, got = run_both(model, feeds)
    rnn_calls(cm)
    want = reference(model, feeds)
    own = fg.compile(model, fg.Config(threads=2, cpu_kernels="portable")).run(feeds)
    for name in want:
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want[name]), err_msg=name)
        np.testing.assert_array_equal(np.isnan(own[name]), np.isnan(want[name]), err_msg=name)
        if np.isnan(value):
            assert np.isnan(want[name]).any() and not np.isnan(want[name]).all()
    assert_outputs_close({k: np.nan_to_num(v) for k, v in got.items()},
                         {k: np.nan_to_num(v) for k, v in want.items()})


@pytest.mark.parametrize("attrs,reason", [
    (dict(clip=0.5), "clip"),
    (dict(input_forget=1), "input_forget"),
    (dict(seq_lens=[5, 3, 5]), "sequence_lens"),
    (dict(activations=["Sigmoid", "Relu", "Tanh"]), "activations"),
])
def test_declined_lstm_nodes_say_why(attrs, reason):
    """(onnx.reference ignores these attributes: onnxruntime is the oracle.)"""
    model, feeds = recurrent_model("LSTM", **attrs)
    cm, got = run_both(model, feeds)
    declined = [d for d in cm.report.kernels["declined"] if d["op"] == "LSTM"]
    assert len(declined) == 1 and reason in declined[0]["reason"], declined
    assert not any(isinstance(c.kernel, RnnKernel) for c in cm._executor.binding.calls)
    assert_outputs_close(got, ort_run(model, feeds))


def test_relu_rnn_declines_unless_fast_math():
    """oneDNN's relu maps NaN to 0: the exact build declines it, ``fast_math`` takes it."""
    model, feeds = recurrent_model("RNN", activations=["Relu"])
    cm, got = run_both(model, feeds)
    assert any("relu" in d["reason"] for d in cm.report.kernels["declined"])
    assert_outputs_close(got, ort_run(model, feeds))
    fast, got = run_both(model, feeds, fg.Config(threads=2, fast_math=True))
    rnn_calls(fast)
    assert_outputs_close(got, ort_run(model, feeds))


def test_lstm_weights_from_run_time_decline_with_the_pass_named():
    """W as a graph input: no gate reorder (``replace_rnn``), so the ONNX LSTM declines."""
    from onnx import TensorProto, helper, numpy_helper
    model, feeds = recurrent_model("LSTM", initial=False)
    w = next(i for i in model.graph.initializer if i.name == "W")
    feeds["W"] = numpy_helper.to_array(w)
    model.graph.initializer.remove(w)
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(feeds["W"].shape)))
    cm, got = run_both(model, feeds)
    declined = [d for d in cm.report.kernels["declined"] if d["op"] == "LSTM"]
    assert declined and "replace_rnn" in declined[0]["reason"]
    assert_outputs_close(got, ort_run(model, feeds))


@pytest.mark.parametrize("kind,bidirectional", [("lstm", False), ("gru", True)])
def test_exported_torch_stacks(tmp_path, kind, bidirectional):
    """The forms torch exports (the zoo's lstm_2l and gru_bi, smaller): every recurrent node on
    oneDNN, weights held packed only, and a saved model loading the packed forms as they are."""
    path = torch_recurrent_onnx(tmp_path / f"{kind}.onnx", kind, bidirectional=bidirectional)
    import onnx
    model = onnx.load(path)
    feeds = {"features": np.random.default_rng(1).standard_normal((1, 9, 12)).astype(np.float32)}
    cm, got = run_both(model, feeds)
    assert len(rnn_calls(cm)) == 2
    assert cm.report.kernels["weights_released_bytes"] > 0
    want = ort_run(model, feeds)
    assert_outputs_close(got, want)
    cm.save(tmp_path / "m.fgm")
    loaded = fg.load(tmp_path / "m.fgm")
    assert loaded.load_info["weight_reorders"] == 0
    assert_outputs_close(loaded.run(feeds), want)


@pytest.mark.parametrize("kind,bidirectional", [("lstm", False), ("gru", True)])
def test_bf16_stacks_compute_in_bf16_within_its_error(tmp_path, kind, bidirectional):
    """Under bf16 the recurrent nodes read and write bfloat16 (their bias float32): on oneDNN's
    bf16 cells where the CPU has bf16 arithmetic (the op's own kernel otherwise, in float32
    inside), within bf16's error of the fp32 oracle (relative L2 of the logits); the op's own
    kernel too; and a saved model gives the compiled one's numbers."""
    import onnx
    path = torch_recurrent_onnx(tmp_path / f"{kind}.onnx", kind, bidirectional=bidirectional, hidden=64)
    model = onnx.load(path)
    feeds = {"features": np.random.default_rng(2).standard_normal((1, 9, 12)).astype(np.float32)}
    want = ort_run(model, feeds)["logits"]
    bf16 = fg.Config(threads=2, thread_policy="fixed", precision="bf16")
    cm = fg.compile(model, bf16)
    calls = [c for c in cm._executor.binding.calls if c.node.op_type in RECURRENT]
    assert len(calls) == 2 and all(c.node.inputs[0].dtype == fg.ir.DType.BFLOAT16 for c in calls)
    if BF16_ARITHMETIC:
        assert all(isinstance(c.kernel, RnnKernel) and c.kernel.dtype == torch.bfloat16 for c in calls)
    got = cm.run(feeds)["logits"]
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert 1e-6 < err < 1e-2, err
    own = fg.compile(model, fg.Config(threads=2, precision="bf16", cpu_kernels="portable")).run(feeds)["logits"]
    assert float(np.linalg.norm(own - want) / np.linalg.norm(want)) < 1e-2
    cm.save(tmp_path / "m.fgm")
    assert np.array_equal(fg.load(tmp_path / "m.fgm").run(feeds)["logits"], got)


def test_symbolic_steps_and_batch(tmp_path):
    """An export with dynamic (batch, seq) axes: one compile, a primitive per shape it runs at
    (made at its first run there), every shape's numbers onnxruntime's."""
    import onnx
    model = onnx.load(torch_recurrent_onnx(tmp_path / "d.onnx", "lstm", bidirectional=True, dynamic=True))
    cm = fg.compile(model, CFG)
    for batch, steps in ((1, 5), (3, 9), (2, 1), (3, 9)):
        feeds = {"features": np.random.default_rng(steps).standard_normal((batch, steps, 12)).astype(np.float32)}
        assert_outputs_close(cm.run(feeds), ort_run(model, feeds))
    kernels = [c.kernel for c in rnn_calls(cm)]
    assert len(kernels) == 2 and all({(5, 1), (9, 3), (1, 2)} <= set(k._bound) for k in kernels)
