"""The oneDNN attention kernel (``runtime/backends/cpu/dnnl/attention.py``) against the op's own
torch kernel (``cpu_kernels="portable"``) and a float64 reference: packed q / k / v with heads
(BERT's and GPT-2's form), separate 4-D operands with k given transposed, heads merged or not,
with and without a mask (float32 or the operands' type), float32 and bfloat16; NaN / Inf as
the op's own kernel gives them (``nan_to_zero`` on and off); the declines with their reasons.
Each case checks the node really ran as oneDNN primitives: brgemm, or oneDNN's GEMM on a CPU
where it has no brgemm matmul (AVX2); bfloat16 cases run where oneDNN has bfloat16 kernels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.ir import DType, Graph
from fusegraph.ops import infer_graph
from fusegraph.runtime.backends.cpu.dnnl import available
from fusegraph.runtime.backends.cpu.dnnl.attention import DnnlAttention, brgemm_matmul
from cpu_isa import BF16_ARITHMETIC

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")
PRECISIONS = ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(
    not BF16_ARITHMETIC, reason="oneDNN has no bfloat16 kernels on this CPU: the attention declines"))]

F32 = DType.FLOAT
H, D = 4, 16
E = H * D


def _graph(seq=24, kv_seq=None, packed=True, merge=True, mask="f32", nan_to_zero=1, scale=0.25, batch=1,
           mask_batch=1, mask_heads=1):
    """x -> ScaledDotProductAttention -> y, float32 in and out (precision decides the inside)."""
    kv_seq = kv_seq or seq
    g = Graph("attention", opset={"": 17, "fusegraph": 1})
    attrs = {"scale": scale, "nan_to_zero": nan_to_zero, "merge_heads": int(merge)}
    if packed:
        x = g.add_input("qkv", F32, (batch, seq, 3 * E))
        ins = [x, None, None]
        attrs.update(q_heads=H, k_heads=H, v_heads=H, qkv_split=[E, E, E])
    else:
        ins = [g.add_input("q", F32, (batch, H, seq, D)), g.add_input("kt", F32, (batch, H, D, kv_seq)),
               g.add_input("v", F32, (batch, H, kv_seq, D))]
        attrs.update(k_transposed=1)
        attrs["merge_heads"] = 0
    if mask == "const":          # a relative-position bias: a constant, as a window attention has
        bias = torch.randn(mask_batch, mask_heads, seq, kv_seq, generator=torch.Generator().manual_seed(5))
        ins.append(g.add_constant("bias", bias))
    elif mask is not None:
        ins.append(g.add_input("mask", F32, (mask_batch, 1, seq, kv_seq)))
    node = g.add_node("ScaledDotProductAttention", ins, domain="fusegraph", attrs=attrs, outputs=["y"], name="attn")
    g.outputs.append(node.outputs[0])
    infer_graph(g)
    return g


def _feeds(g, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in g.inputs:
        a = rng.standard_normal(v.shape).astype(np.float32)
        if v.name == "mask":
            a = np.where(rng.random(v.shape) < 0.2, np.float32(-1e4), np.float32(0.0)).astype(np.float32)
        out[v.name] = a
    return out


def _reference(g, feeds) -> np.ndarray:
    """float64 numpy: softmax(q k^T * scale + mask) v, heads merged as the node says."""
    attrs = g.nodes[-1].attrs
    if "qkv_split" in attrs:
        x = feeds["qkv"].astype(np.float64)
        b, s, _ = x.shape
        q, k, v = (x[..., i * E:(i + 1) * E].reshape(b, s, H, D).transpose(0, 2, 1, 3) for i in range(3))
        kt = k.transpose(0, 1, 3, 2)
    else:
        q, kt, v = (feeds[n].astype(np.float64) for n in ("q", "kt", "v"))
    s = q @ kt * attrs["scale"]
    if "mask" in feeds:
        s = s + feeds["mask"].astype(np.float64)
    bias = [v for v in g.nodes[-1].inputs[3:] if v is not None and v.is_const]
    if bias:
        s = s + bias[0].const.double().numpy()
    s = np.exp(s - s.max(-1, keepdims=True))
    y = (s / s.sum(-1, keepdims=True)) @ v
    if attrs.get("merge_heads"):
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    return y


def _compile(g, precision="fp32", kernels="auto"):
    import copy
    return fg.compile(copy.deepcopy(g), fg.Config(threads=2, precision=precision, cpu_kernels=kernels))


def _attention_kernel(m):
    calls = [c for c in m._executor.binding.calls if c.node.op_type == "ScaledDotProductAttention"]
    assert len(calls) == 1
    return calls[0].kernel


def _on_its_fast_form(kernel) -> bool:
    """The node ran as oneDNN primitives, its products brgemm where oneDNN has a brgemm matmul
    for the type here, else its GEMM (never the reference matmul)."""
    if not isinstance(kernel, DnnlAttention):
        return False
    if brgemm_matmul(kernel.dtype):
        return kernel.impl.startswith("brg")
    return "gemm" in kernel.impl and not kernel.impl.startswith("ref")


def _rel(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


CASES = {"packed-merged": {}, "packed-heads-out": {"merge": False}, "no-mask": {"mask": None},
         "separate-k-transposed": {"packed": False, "kv_seq": 40}, "batch-2": {"batch": 2},
         "batch-2-a-mask-each": {"batch": 2, "mask_batch": 2},
         "no-nan-to-zero": {"nan_to_zero": 0},
         "windows-a-bias-for-all": {"batch": 8, "seq": 16, "mask": "const", "mask_heads": H},
         "windows-a-bias-each": {"batch": 8, "seq": 16, "mask": "const", "mask_batch": 8, "mask_heads": H}}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_matches_the_ops_own_kernel_and_the_reference(case, precision):
    g = _graph(**CASES[case])
    m, own = _compile(g, precision), _compile(g, precision, "portable")
    kernel = _attention_kernel(m)
    assert _on_its_fast_form(kernel), kernel.impl
    assert "attn" not in {d["node"] for d in m.report.kernels["declined"]}
    feeds = _feeds(g)
    want = _reference(g, feeds)
    got, theirs = m.run(feeds)["y"], own.run(feeds)["y"]
    if precision == "fp32":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    else:      # one rounding of the scores fewer than the op's own kernel: no worse than it
        assert _rel(got, want) < 1.5e-2 and _rel(got, want) <= 1.2 * _rel(theirs, want) + 1e-4


@pytest.mark.parametrize("nan_to_zero", [1, 0])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_nan_and_inf_as_the_ops_own_kernel(nan_to_zero, precision):
    g = _graph(nan_to_zero=nan_to_zero)
    m, own = _compile(g, precision), _compile(g, precision, "portable")
    assert _on_its_fast_form(_attention_kernel(m))
    feeds = _feeds(g, seed=3)
    feeds["qkv"][0, 2, 5] = np.nan                    # a query with NaN: its row of scores
    feeds["qkv"][0, 7, E + 3] = np.inf                # a key with +inf: a column of +-inf scores
    feeds["mask"][0, 0, 11, :] = -np.inf              # a query that sees nothing
    got, theirs = m.run(feeds)["y"], own.run(feeds)["y"]
    assert np.isnan(theirs).any() == (not nan_to_zero)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(theirs))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(theirs))
    ok = np.isfinite(theirs)
    tol = 1e-4 if precision == "fp32" else 3e-2
    np.testing.assert_allclose(got[ok], theirs[ok], rtol=tol, atol=tol * np.abs(theirs[ok]).max())


def test_declines_shape_generic_kernels_with_the_reason():
    g = _graph(mask=None)
    g.inputs[0].shape = ("batch", "seq", 3 * E)
    infer_graph(g)
    m = fg.compile(g, fg.Config(threads=2, shape_cache=0))
    reasons = [d["reason"] for d in m.report.kernels["declined"] if d["node"] == "attn"]
    assert reasons[0] == "needs static shapes", m.report.kernels["declined"]
    assert not isinstance(_attention_kernel(m), DnnlAttention)
    feeds = _feeds(_graph(mask=None))
    np.testing.assert_allclose(m.run(feeds)["y"], _reference(g, feeds), rtol=1e-4, atol=1e-5)


def test_a_broadcast_batch_declines():
    g = Graph("attention", opset={"": 17, "fusegraph": 1})
    q = g.add_input("q", F32, (2, H, 8, D))
    kt, v = g.add_input("kt", F32, (1, H, D, 8)), g.add_input("v", F32, (1, H, 8, D))
    node = g.add_node("ScaledDotProductAttention", [q, kt, v], domain="fusegraph", outputs=["y"], name="attn",
                      attrs={"scale": 0.25, "k_transposed": 1})
    g.outputs.append(node.outputs[0])
    infer_graph(g)
    m = fg.compile(g, fg.Config(threads=2))
    reasons = [d["reason"] for d in m.report.kernels["declined"] if d["node"] == "attn"]
    assert len(reasons) == 1 and "broadcast" in reasons[0]
    feeds = {n: np.random.default_rng(1).standard_normal(s).astype(np.float32)
             for n, s in (("q", (2, H, 8, D)), ("kt", (1, H, D, 8)), ("v", (1, H, 8, D)))}
    want = torch.softmax(torch.from_numpy(feeds["q"]) @ torch.from_numpy(feeds["kt"]) * 0.25, -1) \
        @ torch.from_numpy(feeds["v"])
    np.testing.assert_allclose(m.run(feeds)["y"], want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case,group", [("no-mask", 8), ("batch-2-a-mask-each", 8), ("windows-a-bias-for-all", 8),
                                        ("windows-a-bias-each", 8), ("batch-2", 1)])
@pytest.mark.parametrize("group_bytes", [None, 100_000])
def test_a_batch_runs_in_groups_of_items(case, group, group_bytes, monkeypatch):
    """Many small attentions (a window attention's windows): one call per group of items, the
    group the largest divisor of the batch whose buffers fit ``GROUP_BYTES``; a mask that
    broadcasts over the batch and is given at run time takes one item per call."""
    from fusegraph.runtime.backends.cpu.dnnl import attention
    if group_bytes is not None:
        monkeypatch.setattr(attention, "GROUP_BYTES", group_bytes)
    params = {**CASES[case], "batch": 8}
    if params.get("mask_batch", 1) > 1:
        params["mask_batch"] = 8
    g = _graph(**params)
    m, own = _compile(g), _compile(g, kernels="portable")
    kernel = _attention_kernel(m)
    assert _on_its_fast_form(kernel), kernel.impl
    seq = params.get("seq", 24)
    item = H * (seq * D * 3 + seq * seq) * 4 + (H * seq * seq * 4 if params.get("mask") == "const"
                                                 and params.get("mask_batch", 1) == 1 else 0)
    want_group = group if group_bytes is None or group == 1 else max(
        n for n in (1, 2, 4, 8) if n * item <= group_bytes or n == 1)
    assert kernel.group == want_group and kernel.calls_per_run == 8 // want_group
    feeds = _feeds(g)
    want = _reference(g, feeds)
    got, theirs = m.run(feeds)["y"], own.run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-5 * np.abs(want).max())
