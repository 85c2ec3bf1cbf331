"""Decoder blocks as ``transformers`` exports them (tests/decoder_builders.py: random He-scaled
weights, opset 17): a Llama block (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU
MLP), Qwen2's (q / k / v biases) and a T5 encoder (RMSNorm, gated GELU). Each compiles to the
fused decoder ops, with none of the exported pieces left (no Pow / ReduceMean / Slice / Neg /
Concat / Expand), runs them on oneDNN's kernels where the shapes are static (brgemm products
and attention, the gated MLP's two products with the gating in their epilogues, a bf16
rotation by constant tables as reorders and a binary, the RMS norms on its layer normalisation), and matches onnxruntime with ORT_DISABLE_ALL at rtol 1e-4:
static and dynamic (batch, sequence) axes."""
from __future__ import annotations

import collections

import pytest

import fusegraph as fg
from cpu_isa import needs_avx512, needs_bf16
from decoder_builders import decoder_feeds, decoder_onnx
from oracle import assert_outputs_close, ort_run

# 512 wide, 8 heads of 64, 2 k / v heads: every weight at least LAYER_MIN_WEIGHT (oneDNN's products)
WIDE = {"hidden": 512, "heads": 8, "kv_heads": 2, "layers": 1}
GONE = {"Pow", "ReduceMean", "Slice", "Neg", "Concat", "Expand", "Sqrt", "Sigmoid", "Softmax", "MatMul"}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoders")
    made = {}

    def get(kind, dynamic, **size):
        key = (kind, dynamic, tuple(sorted(size.items())))
        if key not in made:
            made[key] = str(decoder_onnx(folder / f"{kind}_{'dyn' if dynamic else 'static'}_{len(made)}.onnx",
                                         kind, dynamic=dynamic, **size))
        return made[key]
    return get


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.nodes)


def _impl(model, op):
    """The kernel implementation of each node of ``op``, in order."""
    return [getattr(c.kernel, "impl", None) or "portable" for c in model._executor.binding.calls
            if c.node.op_type == op]


@needs_avx512
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decoder_block_static(exports, kind):
    path = exports(kind, False, **WIDE)
    model = fg.compile(path)
    ops = _ops(model)
    assert ops["RMSNorm"] == 1 and ops["SkipRMSNorm"] == 2 and ops["RotaryEmbedding"] == 2
    assert ops["GatedLinear"] == 1 and ops["ScaledDotProductAttention"] == 1 and not GONE & set(ops)
    assert "GatedActivation" not in ops
    sdpa = next(n for n in model.graph.nodes if n.op_type == "ScaledDotProductAttention")
    assert sdpa.attrs["kv_repeat"] == 4 and sdpa.attrs["q_heads"] == 8 and sdpa.attrs["k_heads"] == 2
    assert all(i.startswith("brg") for i in _impl(model, "ScaledDotProductAttention") + _impl(model, "LinearAct")
               + _impl(model, "GatedLinear"))
    assert all(i.startswith("jit") for i in _impl(model, "RMSNorm") + _impl(model, "SkipRMSNorm"))
    assert not model.report.kernels["declined"]
    for seed in (0, 1):
        feeds = decoder_feeds(seed, 1, 16)
        assert_outputs_close(model.run(feeds), ort_run(path, feeds))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_decoder_block_dynamic_sequence(exports, kind):
    """One compile for every (batch, sequence): the same fused ops, symbolic dims in the
    shapes (the repeat_kv and head-split proofs read the exporters' shape arithmetic); the
    gated MLP stays one packed product and its gating (rows known at run time only)."""
    path = exports(kind, True)
    model = fg.compile(path)
    ops = _ops(model)
    assert ops["RMSNorm"] == 1 and ops["SkipRMSNorm"] == 4 and ops["GatedActivation"] == 2
    if kind != "t5":
        assert ops["RotaryEmbedding"] == 4 and not {"Slice", "Neg", "Transpose"} & set(ops)
        assert not [n for n in model.graph.nodes if n.op_type == "Expand" and len(n.outputs[0].shape) == 5]
        assert all(n.attrs.get("kv_repeat") == 2 for n in model.graph.nodes if n.op_type == "ScaledDotProductAttention")
    assert not {"Pow", "ReduceMean", "Sqrt"} & set(ops)
    for batch, seq in ((1, 16), (2, 7), (1, 33)):
        feeds = decoder_feeds(batch + seq, batch, seq)
        assert_outputs_close(model.run(feeds), ort_run(path, feeds))


def test_t5_encoder_static(exports):
    path = exports("t5", False)
    model = fg.compile(path)
    ops = _ops(model)
    assert ops["RMSNorm"] == 1 and ops["SkipRMSNorm"] == 4 and ops["GatedLinear"] == 2
    assert {n.attrs["activation"] for n in model.graph.nodes if n.op_type == "GatedLinear"} == {"gelu_tanh"}
    assert not {"Pow", "ReduceMean", "Sqrt", "GatedActivation"} & set(ops)
    from fusegraph.runtime.backends.cpu.dnnl import available
    if available():         # two oneDNN products (brgemm, or its gemm on AVX2), the GELU between them
        impls = _impl(model, "GatedLinear")         # (dnnl/gated_linear.py), not ATen's
        assert impls and all(i.startswith(("brg", "gemm:jit")) for i in impls), impls
    feeds = decoder_feeds(3, 1, 16)
    assert_outputs_close(model.run(feeds), ort_run(path, feeds))


@needs_bf16
def test_llama_block_bf16(exports):
    """bfloat16: the products and attention in bf16, the norms' statistics in float32 (their
    output rounded once), the rotation and the gating in float32 inside, rounded once."""
    import numpy as np
    path = exports("llama", False, **WIDE)
    model = fg.compile(path, fg.Config(precision="bf16"))
    assert _ops(model)["RotaryEmbedding"] == 2
    from fusegraph.runtime.backends.cpu.dnnl import available
    if available():         # the rotation by constant tables on oneDNN (dnnl/rotary.py)
        assert all(i.startswith("jit") for i in _impl(model, "RotaryEmbedding")), _impl(model, "RotaryEmbedding")
    feeds = decoder_feeds(0, 1, 16)
    got, want = model.run(feeds)["hidden"], ort_run(path, feeds)["hidden"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2
