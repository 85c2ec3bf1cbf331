"""``fusegraph compare --precision``, the ``--precision`` / ``--op-precision`` flags, the TOML
``op_precision`` table, the ``inspect`` precision line and the HTML precision section, on a
tiny Conv -> Relu -> Flatten -> Gemm classifier (issue 16 part 4, issue 20's precision part)."""
from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as H
from onnx import numpy_helper

import fusegraph as fg
from fusegraph.cli.common import op_precision_arg
from fusegraph.cli.main import build_parser, main
from fusegraph.tools.compare_precision import compare_precision, render_precision
from fusegraph.config_file import config_from_toml
from fusegraph.errors import ConfigError, UsageError
from fusegraph.tools.html.page import render_html
from fusegraph.runtime.feeds import random_feeds


def tiny_classifier(classes: int = 10) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    g = numpy_helper.from_array((rng.standard_normal((8 * 8 * 8, classes)) * 0.1).astype(np.float32), "g")
    nodes = [H.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="/body/conv"),
             H.make_node("Relu", ["c"], ["r"], name="/body/relu"),
             H.make_node("Flatten", ["r"], ["f"], name="/head/flatten"),
             H.make_node("Gemm", ["f", "g"], ["logits"], name="/head/gemm")]
    graph = H.make_graph(nodes, "tiny", [H.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                         [H.make_tensor_value_info("logits", T.FLOAT, [1, classes])], [w, b, g])
    return H.make_model(graph, opset_imports=[H.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("prec") / "tiny.onnx"
    onnx.save(tiny_classifier(), p)
    return p


@pytest.fixture(scope="module")
def result(path):
    return compare_precision(str(path), "bf16", inputs=3, runs=3, config=fg.Config(threads=1))


@pytest.fixture(scope="module")
def bf16(path):
    model = fg.compile(str(path), fg.Config(precision="bf16", threads=1))
    yield model
    model.close()


def _text(renderable) -> str:
    from rich.console import Console
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


# -- compare --precision

def test_compare_precision_figures(result, bf16):
    assert result.reference == "onnxruntime (ORT_DISABLE_ALL)" and result.inputs == 3 and result.runs == 3
    acc = result.accuracy["logits"]
    assert set(acc) == {"fp32", "reduced", "reduced_vs_fp32"}
    assert acc["fp32"]["rel_l2"] < 1e-5 and acc["fp32"]["cosine"] > 0.999999      # fp32 matches the oracle
    assert 1e-4 < acc["reduced"]["rel_l2"] < 5e-2                                   # bf16 rounds, a little
    assert acc["reduced"]["rel_l2"] > 100 * acc["fp32"]["rel_l2"]
    assert acc["reduced"]["max_abs"] > acc["fp32"]["max_abs"] and 0.99 < acc["reduced"]["cosine"] < 1.0
    assert acc["reduced_vs_fp32"]["rel_l2"] > 0
    for side in acc.values():          # a [1, 10] output is a classifier: top-1 over the 3 inputs
        assert side["inputs"] == 3 and side["top1_agree"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert acc["fp32"]["top1_agree"] == 1.0
    assert result.worst_rel_l2() == acc["reduced"]["rel_l2"]
    prec = bf16.report.precision
    assert result.reduced.by_dtype == prec["by_dtype"] == {"bf16": 3}         # the logits: bf16 operands
    assert result.reduced.casts == prec["casts"] > 0 and result.fp32.by_dtype == {} and result.fp32.casts == 0
    assert result.kept_fp32 == prec["kept_fp32"] == []
    assert result.fp32_logits == prec["fp32_logits"] and [k["op"] for k in result.fp32_logits] == ["Linear"]
    assert result.reduced.arena_bytes == bf16.report.memory.arena_bytes and result.fp32.arena_bytes > 0
    assert result.fp32.artifact_bytes > 1000 and result.reduced.artifact_bytes > 1000
    assert result.fp32.latency_ms > 0 and result.reduced.p90_ms >= result.reduced.latency_ms
    assert json.loads(json.dumps(result.to_dict()))["accuracy"]["logits"]["reduced"]["rel_l2"] == acc["reduced"]["rel_l2"]


def test_render_has_every_row(result):
    text = _text(render_precision(result, "t"))
    for words in ("latency median", "latency p90", "activation arena (planned)", "artifact (.fgm) size",
                  "nodes by dtype", "bf16 3", "rel L2 error (worst)", "max abs error", "cosine (mean)",
                  "top-1 agreement", "bf16 vs ref", "fp32 vs ref", "logits written in fp32 from bf16 operands (1)"):
        assert words in text, words
    rel = f"{result.accuracy['logits']['reduced']['rel_l2']:.3g}"
    assert re.search(rf"rel L2 error \(worst\)[\s│|]+\S+[\s│|]+{re.escape(rel)}\s", text), text


def test_non_onnx_source_is_checked_against_fp32_at_O0():
    from fusegraph.frontends.onnx import import_onnx
    graph = import_onnx(tiny_classifier())
    n = len(graph.nodes)
    r = compare_precision(graph, "bf16", inputs=1, runs=1, config=fg.Config(threads=1))
    assert r.reference == "fusegraph fp32 at O0" and len(graph.nodes) == n   # the caller's graph untouched
    assert r.accuracy["logits"]["fp32"]["rel_l2"] < 1e-5 < r.accuracy["logits"]["reduced"]["rel_l2"]


def test_op_precision_reaches_the_reduced_side_only(path):
    r = compare_precision(str(path), "bf16", inputs=1, runs=1, config=fg.Config(threads=1),
                          op_precision=(("/head/gemm", "bf16"),))
    assert r.reduced.by_dtype == {"bf16": 3} and r.kept_fp32 == r.fp32_logits == [] and r.fp32.by_dtype == {}
    with pytest.raises(UsageError, match="reduced side"):
        compare_precision(str(path), "fp32")


def test_auto_says_why_it_compared_the_fp32_model(path, monkeypatch):
    from fusegraph.compiler import precision_auto
    monkeypatch.setattr(precision_auto, "bf16_declined", lambda device: "no bf16 arithmetic here")
    r = compare_precision(str(path), "auto", inputs=1, runs=1, config=fg.Config(threads=1))
    assert r.declined == "no bf16 arithmetic here" and r.accuracy["logits"]["reduced_vs_fp32"]["rel_l2"] == 0
    assert "auto chose fp32: no bf16 arithmetic here" in _text(render_precision(r, "t"))
    assert compare_precision(str(path), "bf16", inputs=1, runs=1, config=fg.Config(threads=1)).declined is None
    model = fg.compile(str(path), fg.Config(precision="auto", threads=1))
    assert "<p>auto chose fp32: no bf16 arithmetic here</p>" in render_html(model)


def test_cli_compare_precision(path, capsys):
    assert main(["compare", str(path), "--precision", "bf16", "--runs", "2", "--inputs", "2", "--threads", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fp32 vs bf16 (O2)" in out and "2 random input(s)" in out and "bf16 vs ref" in out
    assert "logits" in out and "median of 2 runs" in out


@pytest.mark.parametrize("argv, words", [
    (["compare", "{p}", "--precision", "bf17"], ["Config.precision must be one of", "'bf17'"]),
    (["compare", "{p}", "--precision", "fp32"], ["reduced side"]),
    (["compare", "{p}", "--inputs", "2"], ["--inputs", "--precision"]),
    (["compare", "{p}", "--op-precision", "Conv=bf16"], ["--op-precision", "--precision"]),
    (["run", "{p}", "--precision", "int4"], ["Config.precision must be one of", "'int4'"]),
    (["run", "{p}", "--op-precision", "Conv=bf17"], ["Config.op_precision", "'bf17'"]),
    (["inspect", "{p}", "--op-precision", "Conv"], ["--op-precision expects NODE_OR_OP="]),
    (["inspect", "{p}", "--op-precision", "NoSuchOp=bf16"], ["'NoSuchOp'", "no node name or op type"]),
    (["compile", "{p}", "-o", "{d}/x.fgm", "--precision", "fp8"], ["Config.precision must be one of"]),
    (["bench", "{d}/m.fgm", "--precision", "bf16", "--runs", "1"], ["already compiled"]),
])
def test_bad_precision_flags_are_one_line_errors(path, tmp_path, capsys, argv, words):
    fg.compile(str(path)).save(tmp_path / "m.fgm")
    code = main([a.format(p=path, d=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fusegraph: error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_flags_parse_into_the_config(path):
    from fusegraph.cli.common import config_from_args
    assert op_precision_arg(["Conv=bf16", "/head/gemm=fp32", "Conv=fp16", "a=b=fp32"]) == \
        (("Conv", "fp16"), ("/head/gemm", "fp32"), ("a=b", "fp32"))
    for cmd in (["run", str(path)], ["inspect", str(path)], ["bench", str(path)]):
        args = build_parser().parse_args(cmd + ["--precision", "bf16", "--op-precision", "Conv=bf16",
                                                "--op-precision", "/head/gemm=fp32"])
        assert config_from_args(args).precision == "bf16"
        assert config_from_args(args).op_precision == (("Conv", "bf16"), ("/head/gemm", "fp32"))
    assert config_from_args(build_parser().parse_args(["run", str(path)])) == fg.Config()


def test_compile_merges_toml_and_flags(path, tmp_path, capsys):
    (tmp_path / "cfg.toml").write_text('precision = "bf16"\n'
                                       'op_precision = { Conv = "fp32", "/head/gemm" = "bf16" }\n')
    out = tmp_path / "o.fgm"
    assert main(["compile", str(path), "-o", str(out), "--config", str(tmp_path / "cfg.toml"),
                 "--op-precision", "Conv=bf16"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    loaded = fg.load(out)
    assert loaded.config.precision == "bf16"
    assert loaded.config.op_precision == (("Conv", "bf16"), ("/head/gemm", "bf16"))   # the flag wins
    assert loaded.report.precision["by_dtype"] == {"bf16": 3}
    assert "precision: bf16 policy: nodes 3 bf16" in printed and "op_precision Conv=bf16, /head/gemm=bf16" in printed


def test_toml_op_precision():
    cfg = config_from_toml('precision = "fp16"\nop_precision = { Conv = "bf16", "/head/MatMul" = "fp32" }\n')
    assert cfg.precision == "fp16" and cfg.op_precision == (("Conv", "bf16"), ("/head/MatMul", "fp32"))
    assert config_from_toml('op_precision = [["Conv", "bf16"]]').op_precision == (("Conv", "bf16"),)
    with pytest.raises(ConfigError, match=r"^cfg.toml: Config.op_precision: 'Conv': 'bf17'"):
        config_from_toml('op_precision = { Conv = "bf17" }', where="cfg.toml")
    with pytest.raises(ConfigError, match="Config.precision must be one of"):
        config_from_toml('precision = "int4"', where="cfg.toml")


def test_inspect_prints_a_precision_line(path, capsys):
    assert main(["inspect", str(path), "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("precision:")]
    want = ("precision: bf16 policy: nodes 3 bf16; 1 cast(s); 1 logits product(s) write fp32 from bf16 operands "
            "(first: gemm_to_linear_linear (Linear))")
    assert lines == [want], out
    assert "runs as: O2, bf16 precision," in out
    assert main(["inspect", str(path)]) == 0
    assert "precision:" not in capsys.readouterr().out     # plain fp32: no line


# -- the HTML precision section

def _section(page: str) -> str:
    return page[page.index('<section id="precision">'):page.index('<section id="profile">')]


def test_html_precision_section(bf16, path, result):
    page = render_html(bf16, random_feeds(bf16.inputs), source=str(path), runs=1, comparison=result)
    assert "http://" not in page and "https://" not in page
    sec = _section(page)
    prec = bf16.report.precision
    nodes = sec[sec.index('<div id="precision-nodes">'):]
    rows = re.findall(r'<tr class="node[^"]*" data-key="[^"]*"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>'
                      r'<td>([^<]*)</td><td>([^<]*)</td></tr>', nodes)
    import html as h
    assert [tuple(h.unescape(c) for c in r) for r in rows] == \
        [(n["node"], n["op"], n["dtype"], n["class"], n["why"]) for n in prec["nodes"]]
    shown = dict(re.findall(r'data-fig="([^"]+)" data-value="([^"]*)"', sec))
    assert shown["precision_policy"] == "bf16" and shown["precision_casts"] == str(prec["casts"])
    assert shown["precision_nodes_bf16"] == "3" and "precision_nodes_fp32" not in shown
    assert shown["precision_kept_fp32"] == "0" and shown["precision_fp32_logits"] == "1"
    figs = json.loads(re.search(r'id="fg-figures">(.*?)</script>', page, re.DOTALL).group(1))
    assert figs["precision"] == {"policy": "bf16", "by_dtype": prec["by_dtype"], "casts": prec["casts"],
                                 "kept_fp32": 0, "fp32_logits": 1, "nodes": len(prec["nodes"]), "op_precision": {}}
    assert h.escape(prec["fp32_logits"][0]["why"], quote=True) in sec
    # the accuracy against fp32 O0: a real, non-zero rel L2 for bf16
    acc = re.search(r"<td>logits</td><td>\(1, 10\)</td><td class=num>([^<]*)</td>", sec)
    assert acc and 1e-4 < float(acc.group(1)) < 5e-2
    # the comparison's table: its figures
    assert "onnxruntime (ORT_DISABLE_ALL)" in sec
    assert f"{result.accuracy['logits']['reduced']['rel_l2']:.3g}" in sec


def test_html_fp32_section_says_so(path):
    model = fg.compile(str(path), fg.Config(threads=1))
    try:
        sec = _section(render_html(model))
    finally:
        model.close()
    assert "every op computes in float32" in sec and 'id="precision-nodes"' not in sec
