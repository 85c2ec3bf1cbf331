"""``runtime/backends/cpu/dnnl/blocked.py``: the pure-torch reader of oneDNN blocked layouts.

- ``unpack`` against oneDNN's own reorder: for every weight layout the convolution and matmul
  primitives pick on this machine (3-channel first convolutions, odd channel counts that need
  padding, groups and depthwise, bf16 with its VNNI pair blocks, matmul weights [K, N] read
  from [N, K] with ``trans_b``), a plain tensor is packed with ``primitive.reorder`` into the layout
  the primitive's ``Q_WEIGHTS_MD`` gives, read back with ``unpack`` and compared bit for bit;
  also the packed forms a compiled model holds (``WeightStore.export``) against its ONNX
  initializers.
- ``check`` refuses hostile descriptions (an artifact is untrusted) with a reason, and never
  raises; ``unpack`` of a refused description raises ``ValueError`` only.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.runtime.backends.cpu.dnnl import available, capi
from fusegraph.runtime.backends.cpu.dnnl.blocked import check, unpack

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN (onednn-cpu-gomp) does not load here")

if available():
    from fusegraph.runtime.backends.cpu.dnnl.capi import Dims
    from fusegraph.runtime.backends.cpu.dnnl.layouts import channels_last, contiguous
    from fusegraph.runtime.backends.cpu.dnnl.memory import DTYPES, MemDesc
    from fusegraph.runtime.backends.cpu.dnnl.primitive import Attr, create, reorder

BF16_OK = available() and "avx512_bf16" in open("/proc/cpuinfo").read()


def conv_weights_md(ci, co, k, group, dtype, nhwc, hw=14, stride=1):
    """The weight descriptor oneDNN's convolution picks (weights ``any``), and the plain dims."""
    lib = capi.load()
    pad = k // 2
    oh = (hw + 2 * pad - k) // stride + 1
    xs, ys = (1, ci, hw, hw), (1, co, oh, oh)
    lay = channels_last if nhwc else contiguous
    x_md, y_md = MemDesc.of(xs, dtype, lay(xs)), MemDesc.of(ys, dtype, lay(ys))
    wdims = [co, ci, k, k] if group == 1 else [group, co // group, ci // group, k, k]
    w_any = MemDesc.tagged(wdims, DTYPES[dtype], capi.TAG_ANY)
    attr = Attr()
    prim = create("convolution", lambda pd: lib.convolution_forward_primitive_desc_create(
        pd, lib.engine, capi.FORWARD_INFERENCE, capi.CONVOLUTION_DIRECT, x_md.handle, w_any.handle, None,
        y_md.handle, Dims(stride, stride), Dims(0, 0), Dims(pad, pad), Dims(pad, pad), attr.handle))
    plain_md = MemDesc.tagged(wdims, DTYPES[dtype], capi.TAG_ABCD if group == 1 else capi.TAG_ABCDE)
    return prim, prim.md(capi.Q_WEIGHTS_MD), plain_md, wdims


def matmul_weights_md(m, k, n, dtype, trans_b):
    lib = capi.load()
    x_md, y_md = MemDesc.of((m, k), dtype), MemDesc.of((m, n), dtype)
    w_any = MemDesc.tagged([k, n], DTYPES[dtype], capi.TAG_ANY)
    attr = Attr()
    prim = create("matmul", lambda pd: lib.matmul_primitive_desc_create(
        pd, lib.engine, x_md.handle, w_any.handle, None, y_md.handle, attr.handle))
    plain_md = MemDesc.of((k, n), dtype, (1, k) if trans_b else (n, 1))
    return prim, prim.md(capi.Q_WEIGHTS_MD), plain_md


def pack(plain: torch.Tensor, plain_md, want) -> torch.Tensor:
    """``plain`` reordered by oneDNN into ``want`` (padding bytes filled with 0xAB first: a
    reader that takes them for data is caught)."""
    data = torch.full((want.size,), 0xAB, dtype=torch.uint8)
    reorder(plain_md, plain.data_ptr(), want, data.data_ptr())
    return data


CONVS = {   # name -> (ci, co, k, group, nhwc, stride)
    "first_conv_3ch_nhwc": (3, 16, 7, 1, True, 2),
    "first_conv_3ch_nchw": (3, 16, 3, 1, False, 1),
    "odd_17_to_30_nhwc": (17, 30, 3, 1, True, 1),
    "odd_17_to_30_nchw": (17, 30, 3, 1, False, 1),
    "pointwise_64_nhwc": (64, 32, 1, 1, True, 1),
    "wide_3x3_nhwc": (32, 48, 3, 1, True, 1),
    "groups2_nhwc": (16, 24, 3, 2, True, 1),
    "depthwise_nhwc": (32, 32, 3, 32, True, 1),
    "depthwise_odd_nhwc": (17, 17, 3, 17, True, 1),
}


def _case_dtypes():
    out = [(name, torch.float32) for name in CONVS]
    if BF16_OK:
        out += [(name, torch.bfloat16) for name in CONVS]
    return out


@pytest.mark.parametrize("name,dtype", _case_dtypes(), ids=lambda v: str(v).replace("torch.", ""))
def test_unpack_equals_original_conv_weights(name, dtype):
    ci, co, k, group, nhwc, stride = CONVS[name]
    prim, want, plain_md, wdims = conv_weights_md(ci, co, k, group, dtype, nhwc, stride=stride)
    assert not prim.is_reference, prim.impl
    plain = torch.randn(wdims, generator=torch.Generator().manual_seed(1)).to(dtype)
    data = pack(plain, plain_md, want)
    desc = want.describe()
    assert check(desc, data.numel()) is None
    got = unpack(desc, data)
    assert got.dtype == dtype and list(got.shape) == wdims
    assert torch.equal(got, plain), f"{name} {dtype}: {desc}"


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if BF16_OK else []),
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("m,k,n,trans_b", [(6, 32, 24, False), (6, 32, 24, True), (1, 17, 30, True),
                                           (128, 64, 96, False), (5, 768, 64, True)])
def test_unpack_equals_original_matmul_weights(m, k, n, trans_b, dtype):
    prim, want, plain_md = matmul_weights_md(m, k, n, dtype, trans_b)
    assert not prim.is_reference, prim.impl
    w = torch.randn((n, k) if trans_b else (k, n), generator=torch.Generator().manual_seed(2)).to(dtype)
    data = pack(w.contiguous(), plain_md, want)
    desc = want.describe()
    assert check(desc, data.numel()) is None
    got = unpack(desc, data)
    assert torch.equal(got, w.T if trans_b else w), desc


def test_a_plain_weight_with_longer_rows_reads_back_and_is_checked():
    """A plain ``K x N`` weight held with each row longer than N (``linear.leading_dimension``)
    is described by its strides: accepted with exactly its bytes, read back as the weight,
    refused one row short and with strides that reach past its bytes."""
    k, n, ld = 8, 256, 272
    w = torch.randn(k, n, generator=torch.Generator().manual_seed(3))
    want = MemDesc.of((k, n), torch.float32, (ld, 1))
    data = pack(w, MemDesc.of((k, n), torch.float32), want)
    desc = want.describe()
    assert desc["strides"] == [ld, 1] and data.numel() == k * ld * 4
    assert check(desc, data.numel()) is None
    assert torch.equal(unpack(desc, data), w)
    short = (k - 1) * ld * 4
    assert isinstance(check({**desc, "size": short}, short), str)
    assert isinstance(check({**desc, "strides": [ld * 2, 1]}, data.numel()), str)


def test_layouts_met_are_blocked_ones():
    """The cases above really exercise blocked layouts: inner blocks, padding (17 / 30 channels),
    and (bf16) a dim split by two blocks, VNNI's pair innermost."""
    descs = {}
    for name in CONVS:
        for dtype in [torch.float32] + ([torch.bfloat16] if BF16_OK else []):
            ci, co, k, group, nhwc, stride = CONVS[name]
            descs[(name, dtype)] = conv_weights_md(ci, co, k, group, dtype, nhwc, stride=stride)[1].describe()
    assert any(d["blocks"] for d in descs.values())
    assert any(d["padded"] != d["dims"] for d in descs.values())
    if BF16_OK:
        vnni = [d for (_, dt), d in descs.items() if dt == torch.bfloat16 and len(set(d["idxs"])) < len(d["idxs"])]
        assert vnni and all(d["blocks"][-1] == 2 for d in vnni), descs


def _model_with_weights():
    sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
    from passes_util import F, const, model, node
    rng = np.random.default_rng(0)
    w = {"w1": rng.standard_normal((30, 3, 3, 3)), "w2": rng.standard_normal((17, 30, 3, 3)),
         "w3": rng.standard_normal((17, 1, 3, 3)), "wl": rng.standard_normal((24, 17))}
    nodes = [node("Conv", ["x", "w1"], "a", pads=[1] * 4), node("Relu", ["a"], "ar"),
             node("Conv", ["ar", "w2"], "b", pads=[1] * 4), node("Relu", ["b"], "br"),
             node("Conv", ["br", "w3"], "c", pads=[1] * 4, group=17), node("Relu", ["c"], "cr"),
             node("GlobalAveragePool", ["cr"], "g"), node("Flatten", ["g"], "f"),
             node("Gemm", ["f", "wl"], "h", transB=1), node("Relu", ["h"], "y")]
    return model(nodes, [("x", F, [1, 3, 12, 12])], ["y"], [const(k, v) for k, v in w.items()], opset=17), w


def test_compiled_model_forms_unpack_to_its_initializers():
    """The forms a compile made hold its weights: a convolution's ``[O, I, kh, kw]`` (grouped:
    ``[g, O/g, I/g, kh, kw]``), a product's operand ``[K, N]`` (the Gemm's ``transB`` weight
    ``[N, K]`` transposed)."""
    m, weights = _model_with_weights()
    cm = fg.compile(m, fg.Config(threads=2))
    forms = cm._executor.backend.store.export()
    assert set(forms) == set(weights), (sorted(forms), cm.report.kernels)
    for name, held in forms.items():
        want = torch.from_numpy(weights[name].astype(np.float32))
        for desc, data, perm in held:
            assert check(desc, data.numel()) is None
            assert perm == ((1, 0) if name == "wl" else tuple(range(want.dim())))   # the form's orientation
            got = unpack(desc, data)
            got = got.T if name == "wl" else got.reshape(want.shape)
            assert torch.equal(got, want), name
            placeholder = torch.empty(want.shape, device="meta")
            assert torch.equal(cm._executor.backend.store.plain(name, placeholder), want), name


# --------------------------------------------------------------------------- hostile descriptions

def _good():
    """A real blocked description and its bytes (a convolution's weights)."""
    _, want, plain_md, wdims = conv_weights_md(17, 30, 3, 1, torch.float32, True)
    plain = torch.randn(wdims, generator=torch.Generator().manual_seed(3))
    return want.describe(), pack(plain, plain_md, want)


def _mutants():
    d, data = _good()
    nd, n = len(d["dims"]), data.numel()
    assert d["blocks"], d            # a blocked layout: the block mutations below mean something
    per_dim = [1] * nd
    for b, i in zip(d["blocks"], d["idxs"]):
        per_dim[i] *= b
    # the dim whose outer stride reaches furthest: doubling it reaches past the bytes
    far = max(range(nd), key=lambda i: (d["padded"][i] // per_dim[i] - 1) * d["strides"][i])
    assert (d["padded"][far] // per_dim[far] - 1) * d["strides"][far] > 0
    out = {
        "not_a_dict": ([1, 2], n),
        "none": (None, n),
        "missing_key": ({k: v for k, v in d.items() if k != "idxs"}, n),
        "extra_key": ({**d, "offset": 0}, n),
        "stride_past_the_bytes": ({**d, "strides": [s * (2 if i == far else 1)
                                                     for i, s in enumerate(d["strides"])]}, n),
        "bytes_truncated": (d, n - 4),
        "block_names_missing_dim": ({**d, "idxs": [nd] + d["idxs"][1:]}, n),
        "block_of_zero": ({**d, "blocks": [0] + d["blocks"][1:]}, n),
        "idxs_shorter_than_blocks": ({**d, "idxs": d["idxs"][:-1]}, n),
        "size_wrong": ({**d, "size": n + 4}, n),
        "size_not_int": ({**d, "size": str(n)}, n),
        "dt_unknown": ({**d, "dt": 99}, n),
        "dt_string": ({**d, "dt": "f32"}, n),
        "kind_not_blocked": ({**d, "kind": 1}, n),
        "padded_below_dims": ({**d, "padded": [d["dims"][0] - 1] + d["padded"][1:]}, n),
        "padded_not_whole_blocks": ({**d, "padded": [d["padded"][0] + 1] + d["padded"][1:]}, n),
        "dims_string": ({**d, "dims": "abcd"}, n),
        "dims_dict": ({**d, "dims": {"0": 1}}, n),
        "dims_empty": ({**d, "dims": [], "padded": [], "strides": []}, n),
        "dims_thirteen": ({**d, "dims": [1] * 13, "padded": [1] * 13, "strides": [1] * 13}, n),
        "dims_negative": ({**d, "dims": [-1] + d["dims"][1:]}, n),
        "dims_float": ({**d, "dims": [float(v) for v in d["dims"]]}, n),
        "dims_bool": ({**d, "dims": [True] * nd}, n),
        "strides_none": ({**d, "strides": None}, n),
        "strides_huge": ({**d, "strides": [1 << 41] + d["strides"][1:]}, n),
        "strides_short": ({**d, "strides": d["strides"][:-1]}, n),
        "blocks_int": ({**d, "blocks": 16}, n),
        "idxs_string": ({**d, "idxs": "01"}, n),
        "blocks_nested": ({**d, "blocks": [[16]] * len(d["blocks"])}, n),
        "thirteen_blocks": ({**d, "blocks": [1] * 13, "idxs": [0] * 13}, n),
    }
    return out


MUTANTS = list(_mutants()) if available() else []


@pytest.mark.parametrize("name", MUTANTS)
def test_check_refuses_hostile_description(name):
    desc, nbytes = _mutants()[name]
    why = check(copy.deepcopy(desc), nbytes)
    assert isinstance(why, str) and why, f"{name}: accepted"
    with pytest.raises(ValueError, match="blocked weight"):
        unpack(copy.deepcopy(desc), torch.zeros(max(nbytes, 0), dtype=torch.uint8))


def test_check_accepts_the_real_description():
    d, data = _good()
    assert check(d, data.numel()) is None


@pytest.mark.parametrize("dt", [[3], {"3": 3}])
def test_check_refuses_unhashable_data_type(dt):
    d, data = _good()
    assert isinstance(check({**d, "dt": dt}, data.numel()), str)


def test_check_refuses_bytes_not_whole_elements():
    desc = {"dims": [1], "padded": [1], "strides": [1], "blocks": [], "idxs": [], "dt": capi.F32,
            "kind": 2, "size": 6}
    assert isinstance(check(desc, 6), str)
    with pytest.raises(ValueError):
        unpack(desc, torch.zeros(6, dtype=torch.uint8))


def test_check_refuses_more_elements_than_bytes():
    desc = {"dims": [1 << 20], "padded": [1 << 20], "strides": [0], "blocks": [], "idxs": [], "dt": capi.F32,
            "kind": 2, "size": 4}
    assert isinstance(check(desc, 4), str)
