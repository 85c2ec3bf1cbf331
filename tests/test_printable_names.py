"""Names from a model never reach the terminal raw (issue 39 #14): a model whose node and value
names hold an ESC colour sequence, a CR, a NUL and a bidi override is run through every
``fusegraph`` output that prints model-provided names (the IR listing, the kernel summary and
its declines, the op histogram, the precision line, ``--fusions``, ``--streams``, ``run``'s
outputs, ``profile``'s tables, ``bisect`` and its precision ranking, ``str(model.report)``):
each prints the names escaped (``\\x1b``, ``\\r``, ``\\x00``, ``\\u202e``), and nothing it prints
holds a character that is not printable but a newline."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as H
from onnx import numpy_helper

import fusegraph as fg
from fusegraph.cli.main import main
from fusegraph.report.printable import printable
from fusegraph.tools.bisect import BisectResult, Divergence

HOSTILE = "n\x1b[31mRED\rCR\x00NUL\u202eBIDI"
ESCAPED = "n\\x1b[31mRED\\rCR\\x00NUL\\u202eBIDI"


def hostile_model() -> onnx.ModelProto:
    """Two conv branches joined by a Concat, then a conv (the logits) and a mean: every node and
    every intermediate value named ``HOSTILE + suffix``, the output too."""
    rng = np.random.default_rng(0)
    ws = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), f"w{i}")
          for i, shape in enumerate([(8, 8, 3, 3), (8, 8, 3, 3), (8, 16, 3, 3)])]
    h = HOSTILE
    nodes = [H.make_node("Conv", ["x", "w0"], [h + "a0"], pads=[1, 1, 1, 1], name=h + "conv_a"),
             H.make_node("Relu", [h + "a0"], [h + "a"], name=h + "relu_a"),
             H.make_node("Conv", ["x", "w1"], [h + "b0"], pads=[1, 1, 1, 1], name=h + "conv_b"),
             H.make_node("Relu", [h + "b0"], [h + "b"], name=h + "relu_b"),
             H.make_node("Concat", [h + "a", h + "b"], [h + "cat"], axis=1, name=h + "concat"),
             H.make_node("Conv", [h + "cat", "w2"], [h + "c"], pads=[1, 1, 1, 1], name=h + "conv_c"),
             H.make_node("ReduceMean", [h + "c"], [h + "y"], axes=[2, 3], keepdims=0, name=h + "mean")]
    g = H.make_graph(nodes, h + "graph", [H.make_tensor_value_info("x", T.FLOAT, [1, 8, 16, 16])],
                     [H.make_tensor_value_info(h + "y", T.FLOAT, [1, 8])], ws)
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("names") / "m.onnx"
    onnx.save(hostile_model(), p)
    fg.compile(str(p), fg.Config(level="O1")).save(p.parent / "o1.fgm")    # profile has no --level
    return p


def _clean(text: str, section: str) -> None:
    bad = sorted({ch for ch in text if not (ch.isprintable() or ch == "\n")})
    assert not bad, f"{section} printed raw control characters {bad!r}"
    assert ESCAPED in text, f"{section} did not print the hostile names (escaped):\n{text[:2000]}"


# fusion names what it makes afresh (``conv_relu_fusedconv``): at O1 the model's names stay
@pytest.mark.parametrize("section, argv", [
    ("IR listing, kernel summary and declines, op histogram", ["inspect", "{m}", "--level", "O1"]),
    ("precision line", ["inspect", "{m}", "--level", "O1", "--precision", "bf16"]),
    ("fusions", ["inspect", "{m}", "--fusions"]),
    ("stream table", ["inspect", "{m}", "--level", "O1", "--num-streams", "2"]),
    ("run outputs", ["run", "{m}"]),
    ("compile summary", ["compile", "{m}", "--level", "O1", "--precision", "bf16", "-o", "{d}/m.fgm"]),
    ("profile tables", ["profile", "{d}/o1.fgm", "--runs", "2"]),
    ("bisect precision ranking", ["bisect", "{m}", "--precision", "bf16"]),
])
def test_cli_prints_model_names_escaped(path, capsys, section, argv):
    code = main([a.format(m=path, d=path.parent) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    _clean(out.out + out.err, section)


def test_each_section_shows_the_names(path, capsys):
    """The sections above are where the names are: the kernel line names a declined Concat, the
    precision line the logits conv, the stream table a node of each branch."""
    main(["inspect", str(path)])
    text = capsys.readouterr().out
    assert "declined" in text and f"{ESCAPED}concat" in text
    main(["inspect", str(path), "--level", "O1", "--precision", "bf16"])
    text = capsys.readouterr().out
    assert f"heavy op(s) kept in fp32 (first: {ESCAPED}conv_c (Conv)" in text
    main(["inspect", str(path), "--level", "O1", "--num-streams", "2"])
    text = capsys.readouterr().out
    assert "streams: 2" in text and f"{ESCAPED}conv_a" in text and f"{ESCAPED}conv_b" in text


def test_report_text_and_loaded_model_escape_names(path, tmp_path):
    model = fg.compile(str(path), fg.Config(precision="bf16", level="O1"))
    model.save(tmp_path / "m.fgm")
    for m in (model, fg.load(tmp_path / "m.fgm")):
        text = str(m.report)
        assert not any(not (ch.isprintable() or ch == "\n") for ch in text)
    # the model name is the file's, so it is the precision line that carries a hostile name here
    assert ESCAPED in str(model.report)


def test_bisect_divergence_text_escapes_names():
    found = Divergence("pass", 3, "constant_fold", rule=HOSTILE + "rule", application=1, applications=2,
                       nodes=[HOSTILE + "a", HOSTILE + "b"], removed=[f"  %{HOSTILE}a = Relu(%x)"],
                       added=[f"  %{HOSTILE}b = Relu(%x)"], error={"output": HOSTILE + "y", "rel_l2": 0.5})
    text = BisectResult(HOSTILE + "model", "onnxruntime", 1e-4, 1e-5, "O2", 10, 4, found).to_text()
    _clean(text, "bisect divergence")
    assert text.count(ESCAPED) >= 6


def test_printable_escapes_only_what_is_not_printable():
    assert printable(HOSTILE) == ESCAPED
    assert printable("conv_1/relu é日本 [bold]") == "conv_1/relu é日本 [bold]"
    assert printable("a\nb\u2028c\x85d\te") == "a\\nb\\u2028c\\x85d\\te"
