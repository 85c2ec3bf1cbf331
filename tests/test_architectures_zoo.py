"""The architecture zoo's build path (``fusegraph.testing.architectures``): the cheapest entries
exported and checked against PyTorch, the cache's corruption handling, the export check's
ability to fail, and ``benchmarks/zoo_table.py --help``."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fusegraph.errors import ModelLoadError, UsageError
from fusegraph.testing import architectures as zoo

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ("lstm_2l", "gru_bi")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo")
    for name in CHEAP:
        zoo.build(name, folder)
    return folder


def test_zoo_covers_the_architectures_issue_40_names():
    names = zoo.zoo_names()
    assert len(names) >= 22 and len(set(names)) == len(names)
    for family in ("resnet", "mobilenet_v2", "mobilenet_v3", "convnext", "deit", "dinov2", "yolos", "wav2vec2",
                   "whisper", "bert", "roberta", "distilbert", "albert", "t5", "bart", "gpt2", "llama", "lstm"):
        assert any(n.startswith(family) for n in names), family


@pytest.mark.parametrize("name", CHEAP)
def test_cheap_entries_export_and_match_pytorch(cache, name):
    path = zoo.build(name, cache)
    meta = zoo.manifest(name, cache)
    assert meta["check"]["oracle"] == "onnxruntime ORT_DISABLE_ALL"
    assert max(meta["check"]["max_abs_err_over_scale"].values()) <= zoo.CHECK_ATOL_OF_SCALE + zoo.CHECK_RTOL
    assert max(meta["check"]["input_sensitivity"].values()) > zoo.MIN_INPUT_SENSITIVITY
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == list(zoo.feeds(name, 0))
    assert {n.op_type for n in model.graph.node} & {"LSTM", "GRU"}      # the recurrent op itself
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, zoo.feeds(name, 3))
    assert out.shape == (1, 100, 40) and np.isfinite(out).all()


def test_feeds_are_seeded_and_masked():
    a, b = zoo.feeds("bert_base_4l", 0), zoo.feeds("bert_base_4l", 0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["input_ids"], zoo.feeds("bert_base_4l", 1)["input_ids"])
    assert a["attention_mask"][0, -zoo.TEXT_PAD:].sum() == 0 and a["attention_mask"][0, 0] == 1
    with pytest.raises(UsageError, match="no zoo architecture"):
        zoo.feeds("no_such_model")


def test_a_corrupt_cache_entry_is_refused_or_rebuilt(cache):
    name = CHEAP[0]
    path, meta = zoo.cached_paths(name, cache)
    good = path.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF                          # one flipped byte inside the weights
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt"):
        zoo.build(name, cache, on_corrupt="refuse")
    with pytest.warns(UserWarning, match="rebuilding"):
        assert zoo.build(name, cache) == path
    assert path.read_bytes() == good                      # the same recipe gives the same bytes
    meta.write_text("{not json")                          # a manifest that cannot be read
    with pytest.raises(ModelLoadError, match="manifest"):
        zoo.build(name, cache, on_corrupt="refuse")
    with pytest.warns(UserWarning):
        zoo.build(name, cache)
    assert json.loads(meta.read_text())["sha256"] == zoo.manifest(name, cache)["sha256"]
    with pytest.raises(UsageError):
        zoo.build(name, cache, on_corrupt="ignore")


def test_the_export_check_fails_on_a_wrong_export(cache, tmp_path):
    name = CHEAP[0]
    model = onnx.load(str(zoo.build(name, cache)))
    bias = max((t for t in model.graph.initializer if t.name.endswith("bias")), key=lambda t: t.dims[0])
    arr = numpy_helper.to_array(bias).copy()
    arr[0] += 0.05                                        # one output channel off by 0.05
    bias.CopyFrom(numpy_helper.from_array(arr, bias.name))
    wrong = tmp_path / "wrong.onnx"
    onnx.save(model, str(wrong))
    with pytest.raises(zoo.ZooBuildError, match="differs between onnxruntime"):
        zoo.check_export(name, zoo.module(name), wrong)


def test_the_recipe_key_changes_with_the_recipe(monkeypatch):
    key = zoo.recipe_key("lstm_2l")
    e = zoo.entry("lstm_2l")
    changed = zoo.Entry(e.name, e.source, e.builder, {**e.config, "hidden": 256}, e.inputs, e.outputs)
    monkeypatch.setattr(zoo, "ENTRIES", tuple(changed if x is e else x for x in zoo.ENTRIES))
    assert zoo.recipe_key("lstm_2l") != key


def test_zoo_table_help_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zoo_table.py"), "--help"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert "--models" in out.stdout and "--json" in out.stdout


def test_zoo_table_classes_onednn_implementations():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import zoo_table
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    expected = {"x64:gemm:jit": "gemm", "brgconv_1x1:avx512_core": "brgemm", "brdgmm_dw:avx512_core": "brgemm",
                "brg:avx512_core_bf16": "brgemm", "jit:uni": "jit", "jit_dw:avx512_core_bf16": "jit",
                "portable": "portable", "simple:any": "other", "ref:any": "other"}
    assert {k: zoo_table.impl_class(k) for k in expected} == expected
    c = zoo_table.census({"backend": "cpu", "implementations": {"x64:gemm:jit": 3, "portable": 2, "jit:uni": 1},
                          "declined": [{"node": "n", "op": "Conv", "family": "conv", "reason": "r"}]})
    assert c["total"] == 6 and c["classes"] == {"jit": 1, "brgemm": 0, "gemm": 3, "portable": 2, "other": 0}

