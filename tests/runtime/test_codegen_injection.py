"""No string from a model or an artifact becomes code: hostile names compile, load and run
correctly, and run nothing.

Node names, value names, graph names, doc strings and metadata are fuzzed with newlines,
carriage returns, quotes, backslashes, unicode line separators (U+2028, U+2029, U+0085), NUL,
comment and decorator characters and very long strings. Each model is compiled, run against
onnxruntime (ORT_DISABLE_ALL), saved and loaded, and an artifact whose graph JSON is edited to
carry the payload and re-sealed (checksums recomputed: they detect corruption, they do not
authenticate) is loaded too. A sentinel file the payload would create must never appear.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from onnx import TensorProto as T, helper as H, numpy_helper

import fusegraph as fg
from fusegraph import artifact as A
from fusegraph.errors import FusegraphError
from oracle import assert_outputs_close, ort_run

SENTINEL = "fg_owned_sentinel.txt"


def _payloads(sentinel: str) -> list[str]:
    code = f'__import__("os").system("touch {sentinel}")'
    return [
        f"t\n{code}\ndef _f():\n #",
        f"t\r{code}\r#",
        f"t\r\n{code}\r\n#",
        f"t\u2028{code}\u2028#",
        f"t\u2029{code}",
        f"t\x85{code}",
        f"t\x00\n{code}",
        f"t'\"\\\n{code}  # \\",
        f'"""\n{code}\n"""',
        f")\n{code}\n(",
        f"\\\n{code}",
        f"\f\v\n{code}",
        "x" * 5000 + f"\n{code}",
        f"@{code}",
        f"é\U0001F600\n{code}",
    ]


def _model(node_name: str, value_name: str, meta: str):
    """Transpose -> Mul(const) -> Relu: a layout op, a fused elementwise pair, names everywhere."""
    w = numpy_helper.from_array(np.linspace(-2, 2, 6, dtype=np.float32).reshape(3, 2), "w" + value_name)
    nodes = [H.make_node("Transpose", ["x"], [value_name], perm=[1, 0], name=node_name, doc_string=meta),
             H.make_node("Mul", [value_name, w.name], ["m" + value_name], name=node_name + "2"),
             H.make_node("Relu", ["m" + value_name], ["y"], name=node_name + "3")]
    g = H.make_graph(nodes, "g" + meta, [H.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                     [H.make_tensor_value_info("y", T.FLOAT, [3, 2])], [w], doc_string=meta)
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 17)], producer_name=meta, doc_string=meta)
    H.set_model_props(m, {"k" + meta: meta})
    return m


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert not (tmp_path / SENTINEL).exists(), "a model string was executed"


X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


@pytest.mark.parametrize("where", ["node", "value", "meta"])
@pytest.mark.parametrize("k", range(len(_payloads(SENTINEL))))
def test_hostile_names_compile_load_and_run_correctly(in_tmp, where, k):
    payload = _payloads(SENTINEL)[k]
    node, value, meta = [payload if where == w else d for w, d in (("node", "n"), ("value", ""), ("meta", "m"))]
    model = _model(node, "v" + value, meta)
    want = ort_run(model, {"x": X})
    for config in (fg.Config(), fg.Config(cpu_kernels="portable"), fg.Config(level="O0"), fg.Config(streams=2)):
        compiled = fg.compile(model, config=config)
        assert compiled.source.isascii()
        assert_outputs_close(compiled.run({"x": X}), want)
    compiled.save(in_tmp / "m.fgm")
    assert_outputs_close(fg.load(in_tmp / "m.fgm").run({"x": X}), want)


@pytest.mark.parametrize("k", range(len(_payloads(SENTINEL))))
def test_resealed_artifact_with_injected_names_runs_nothing(in_tmp, k):
    """Every node name in the stored graph and plan is replaced by a payload and the file is
    re-sealed: it either loads and computes the right numbers, or is refused with a typed error."""
    model = _model("n", "v", "m")
    want = ort_run(model, {"x": X})
    fg.compile(model).save(in_tmp / "m.fgm")
    header, parts = A.unpack(in_tmp / "m.fgm")
    header.pop("parts")
    header.pop("parts_size")
    graph = json.loads(parts["graph"])
    old = [n["name"] for n in graph["nodes"]] if isinstance(graph.get("nodes"), list) else []
    assert old, "the stored graph lists its nodes"
    new = {name: f"{i}{_payloads(SENTINEL)[k]}" for i, name in enumerate(old)}

    def swap(s: str) -> str:
        return new.get(s, s)

    def swap_values(tree):
        if isinstance(tree, dict):
            return {swap(kk) if isinstance(kk, str) else kk: swap_values(v) for kk, v in tree.items()}
        if isinstance(tree, list):
            return [swap_values(v) for v in tree]
        return swap(tree) if isinstance(tree, str) else tree

    parts["graph"] = json.dumps(swap_values(graph)).encode()
    parts["report"] = json.dumps(swap_values(json.loads(parts["report"]))).encode()
    A.pack(in_tmp / "r.fgm", header, parts)
    try:
        loaded = fg.load(in_tmp / "r.fgm")
    except FusegraphError:
        return
    assert loaded.source.isascii()
    assert_outputs_close(loaded.run({"x": X}), want)
    assert not os.path.exists(in_tmp / SENTINEL)


def test_a_model_path_string_is_never_run_as_python(in_tmp):
    """``file.py:factory`` is the command line's (it runs the file, as ``python file.py`` would);
    through the API a string is a model path, and a Python file is not a model."""
    (in_tmp / "evil.py").write_text(f"open({str(in_tmp / SENTINEL)!r}, 'w').close()\ndef make(): pass\n")
    with pytest.raises(FusegraphError):
        fg.compile(f"{in_tmp / 'evil.py'}:make")
    with pytest.raises(FusegraphError):
        fg.compile(str(in_tmp / "evil.py"))
