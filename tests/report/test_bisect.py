"""``fusegraph.tools.bisect``: a rule planted only here (Relu -> Abs, wrong for negative
inputs; Add -> Sub inside fusion) must be named, with its pass, nodes and IR; a clean
pipeline reports no divergence. Oracles: the O0 graph and onnxruntime (ORT_DISABLE_ALL)."""
from __future__ import annotations

import onnx
import pytest
from test_knobs import knob_model

from fusegraph.passes import algebra, pipeline
from fusegraph.passes.rewrite import Rule
from fusegraph.tools.bisect import bisect

PLANTED = Rule("relu_to_abs_planted", lambda node, ctx: True,
               lambda node, match, ctx: ctx.emit("Abs", [node.inputs[0]]), ops=("Relu",))


def test_clean_pipeline_has_no_divergence():
    result = bisect(knob_model())
    assert result.found is None and result.pass_runs > 0
    assert "no divergence" in result.to_text()


@pytest.mark.parametrize("reference", ["O0", "onnxruntime"])
def test_planted_rule_is_named(monkeypatch, tmp_path, reference):
    monkeypatch.setitem(pipeline.RULE_FAMILIES, "algebraic_simplify", list(algebra.RULES) + [PLANTED])
    onnx.save(knob_model(), tmp_path / "m.onnx")
    result = bisect(str(tmp_path / "m.onnx"), reference=reference)
    f = result.found
    assert f is not None and f.stage == "pass"
    assert f.pass_name == "algebraic_simplify" and f.rule == "relu_to_abs_planted"
    assert f.nodes and f.nodes[0].startswith("relu_a")
    assert any("Relu(" in line for line in f.removed) and any("Abs(" in line for line in f.added)
    assert "Relu(" in f.ir_before and "Abs(" in f.ir_after and "Abs(" not in f.ir_before
    text = result.to_text()
    assert "relu_to_abs_planted" in text and "algebraic_simplify" in text


def test_planted_fusion_rule_is_named(monkeypatch):
    from fusegraph.passes.fusion import engine
    from fusegraph.passes.fusion.pattern import Pat, Var

    real = engine.collect_rules
    bad = Rule("add_as_sub_planted", lambda m, ctx: True, lambda m, _, ctx: ctx.emit("Sub", list(m.root.inputs)),
               pattern=Pat("Add", Var("a"), Var("b")), priority=1000)
    monkeypatch.setattr(engine, "collect_rules", lambda: [bad] + real())
    result = bisect(knob_model())
    assert result.found is not None
    assert (result.found.pass_name, result.found.rule) == ("fusion", "add_as_sub_planted")
    assert any("Sub(" in line for line in result.found.added)
