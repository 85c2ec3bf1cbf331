"""The pass manager: levels, disabling, per-pass stats, verification, fixed points, dumps."""
import numpy as np
import pytest

import fusegraph as fg
from fusegraph.errors import ConfigError, PassError, VerifyError
from fusegraph.ir import Graph
from fusegraph.frontends.onnx import import_onnx
from fusegraph.ops import infer_graph, infer_node
from fusegraph.passes import FixedPoint, PassManager, PassResult
from fusegraph.passes.pipeline import PIPELINES, known_names
from passes_util import F, check, const, model, node, ops


def _m():
    """Identity (O1 removes it) + MatMul/Add (O2 makes it a Linear)."""
    return model([node("Identity", ["x"], "i"), node("MatMul", ["i", "w"], "mm"), node("Add", ["mm", "b"], "y")],
                 [("x", F, [2, 3])], ["y"], [const("w", np.ones((3, 4))), const("b", np.arange(4.0))])


def test_levels():
    assert ops(check(_m(), level="O0")) == ["Identity", "MatMul", "Add"]
    assert ops(check(_m(), level="O1")) == ["MatMul", "Add"]
    assert ops(check(_m(), level="O2")) == ["Linear"]
    assert ops(fg.compile(_m())) == ["Linear"]  # O2 is the default
    assert PIPELINES["O0"] == []


def test_o0_records_no_pass():
    assert fg.compile(_m(), fg.Config(level="O0")).report.passes == []


def test_disable_pass_or_rule_by_name():
    assert ops(check(_m(), disabled_passes=("noop_elimination",))) == ["Identity", "Linear"]
    assert ops(check(_m(), disabled_passes=("identity",))) == ["Identity", "Linear"]
    assert ops(check(_m(), disabled_passes=("replace_linear",))) == ["MatMul", "Add"]


def test_unknown_name_is_refused():
    with pytest.raises(ConfigError, match="no_such_pass"):
        fg.compile(_m(), fg.Config(disabled_passes=("no_such_pass",)))
    assert {"constant_fold", "dce", "cse", "mul_one", "matmul_add_to_linear"} <= known_names()


def test_pass_stats_in_report():
    report = fg.compile(_m(), fg.Config(verify_each=True)).report
    names = {p.name for p in report.passes}
    assert {"constant_fold", "dce", "cse", "noop_elimination", "replace_linear"} <= names
    for p in report.passes:
        assert p.seconds >= 0 and p.nodes_before >= 0 and p.nodes_after >= 0 and "iteration" in p.stats
    noop = next(p for p in report.passes if p.name == "noop_elimination" and p.changed)
    assert (noop.nodes_before, noop.nodes_after) == (3, 2) and noop.stats["applied"] == {"identity": 1}
    assert any(f.rule == "matmul_add_to_linear" and f.applied for f in report.fusions)
    assert report.nodes_final == 1


class _Flip:
    """Changes the graph every time: a fixed point is never reached."""
    name = "flip"

    def run(self, graph):
        n = graph.nodes[0]
        n.attrs["alpha"] = 1.0 - n.attrs.get("alpha", 0.0)
        return PassResult(True)


class _Break:
    """Records a wrong shape on a node output."""
    name = "breaker"

    def run(self, graph):
        graph.nodes[0].outputs[0].shape = (7, 7, 7)
        return PassResult(True)


def _graph():
    g = import_onnx(model([node("Relu", ["x"], "y")], [("x", F, [2, 3])], ["y"]))
    infer_graph(g)
    return g


def test_fixed_point_cap_fails_loudly():
    with pytest.raises(PassError, match="did not converge after 5 iterations; still changing: flip"):
        PassManager([FixedPoint("g", [_Flip()], max_iterations=5)]).run(_graph())


class _PeelOne:
    """Removes one Relu of a chain per run, like a fold that frees the next link only once the
    previous one is gone: a fixed point that needs as many iterations as the chain is long."""
    name = "peel_one"

    def run(self, graph):
        relus = [n for n in graph.nodes if n.op_type == "Relu"]
        if len(relus) < 2:
            return PassResult(False)
        first = relus[0]
        first.outputs[0].replace_all_uses_with(first.inputs[0])
        graph.remove(first)
        return PassResult(True)


def test_fixed_point_goes_past_the_cap_while_the_graph_shrinks():
    nodes = [node("Relu", ["x" if i == 0 else f"r{i}"], f"r{i + 1}" if i < 11 else "y") for i in range(12)]
    g = import_onnx(model(nodes, [("x", F, [2, 3])], ["y"]))
    infer_graph(g)
    PassManager([FixedPoint("g", [_PeelOne()], max_iterations=5)]).run(g)
    assert [n.op_type for n in g.nodes] == ["Relu"]


def test_verify_each_names_the_pass():
    with pytest.raises(PassError, match="pass 'breaker' left graph"):
        PassManager([_Break()], verify_each=True, infer=infer_node).run(_graph())
    PassManager([_Break()], verify=False, infer=infer_node).run(_graph())  # unverified: no error


def test_the_pipeline_is_verified_by_default():
    """Without verify_each the manager still checks the graph after the last pass (the fault
    names no pass, and says how to find it), and before the first (as imported)."""
    manager = PassManager([_Break()], infer=infer_node)
    with pytest.raises(PassError, match=r"the pass pipeline left graph .* invalid \(Config\(verify_each=True\)"):
        manager.run(_graph())
    assert manager.verify_seconds > 0
    broken = _graph()
    broken.nodes[0].outputs[0].shape = (9,)
    with pytest.raises(VerifyError, match="invalid before any pass ran"):
        PassManager([], infer=infer_node).run(broken)


def test_compile_verifies_twice_and_reports_its_cost(monkeypatch):
    calls = []
    real = Graph.verify
    monkeypatch.setattr(Graph, "verify", lambda self, infer=None: calls.append(infer) or real(self, infer))
    report = fg.compile(_m()).report
    assert len(calls) == 2 and all(c is infer_node for c in calls)   # as imported, after the pipeline
    assert report.timings["verify"] > 0 and report.timings["passes"] >= report.timings["verify"]
    assert all(p.verify_seconds == 0.0 for p in report.passes)
    calls.clear()
    each = fg.compile(_m(), fg.Config(verify_each=True)).report
    assert len(calls) == len(each.passes) + 1 and all(p.verify_seconds > 0 for p in each.passes)
    assert each.timings["verify"] >= sum(p.verify_seconds for p in each.passes)


def test_dump_after_each_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEGRAPH_DUMP", str(tmp_path))
    fg.compile(_m())
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0].endswith(".000.input.txt")
    assert any("noop_elimination" in f for f in files) and any("replace_linear" in f for f in files)
    assert "Linear" in (tmp_path / files[-1]).read_text()


def test_output_names_survive_rewrites():
    got = fg.compile(_m()).run({"x": np.ones((2, 3), np.float32)})
    assert list(got) == ["y"]
    np.testing.assert_allclose(got["y"], np.ones((2, 4)) * 3 + np.arange(4.0))
