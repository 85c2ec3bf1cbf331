"""``plan_memory`` end to end on IR graphs: modes, user constraints from ``fg.Config``, the
report's data, the conflict graph and the timeline plot."""
import json

import pytest

from fusegraph.config import Config
from fusegraph.plan import plan_memory
from fusegraph.plan.memory import check_assignment
from fusegraph.plan.memory_plan import PlanOptions
from plan_graphs import branchy, chain


def _check(p):
    check_assignment(p.lifetimes.buffers, p.assignment.offsets, p.constraints)
    r = p.report
    assert r.arena_bytes >= r.lower_bound_bytes
    assert r.naive_bytes >= r.lower_bound_bytes


def test_modes_off_balanced_tight():
    g = branchy(width=4)
    off, bal, tight = (plan_memory(g, Config(memory=m)) for m in ("off", "balanced", "tight"))
    for p in (off, bal, tight):
        _check(p)
    assert off.report.algorithm == "naive" and not off.report.inplace
    assert off.report.arena_bytes >= bal.report.arena_bytes >= tight.report.arena_bytes
    assert tight.report.order != "default"
    assert tight.report.lower_bound_bytes < bal.report.lower_bound_bytes
    assert bal.report.arena_bytes <= 1.02 * bal.report.lower_bound_bytes


def test_report_data_and_slots():
    g = chain(4)
    p = plan_memory(g)
    d = p.report.to_dict()
    json.dumps(d)
    by_name = {t["name"]: t for t in d["tensors"]}
    assert by_name["n1"]["offset"] == by_name["n0"]["offset"] and by_name["n1"]["kind"] == "inplace"
    assert by_name["x"]["offset"] is None and by_name["x"]["kind"] == "input"
    assert p.slot("n1") == (p.assignment.offsets["n0"], 4 * 8 * 4 * 4)
    assert p.slot("x") is None
    assert d["ratio_to_lower_bound"] == pytest.approx(p.report.arena_bytes / p.report.lower_bound_bytes)
    assert {"nodes", "edges"} <= set(p.conflict_graph())
    assert "arena" in p.report.summary()


def test_config_constraints_reach_the_plan():
    g = chain(6)
    cfg = Config(exclusive_tensors=("n2",), external_tensors=("n4",), memory="balanced")
    p = plan_memory(g, cfg)
    _check(p)
    assert p.constraints.exclusive == frozenset({"n2"})
    assert p.lifetimes.values["n4"].last == 5


def test_given_order_and_stream_hook():
    g = branchy(width=2)
    order = tuple(reversed(list(g.nodes)))
    with pytest.raises(ValueError, match="before its producer"):
        plan_memory(g, None, PlanOptions(order=order))
    late = plan_memory(g, None, PlanOptions(release_after=lambda v, last: len(g.nodes) - 1))
    _check(late)
    assert late.report.lower_bound_bytes >= plan_memory(g).report.lower_bound_bytes


def test_timeline_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from fusegraph.tools.memory_plot import plot_memory_timeline
    p = plan_memory(branchy(width=3), Config(memory="tight"))
    out = tmp_path / "plan.png"
    plot_memory_timeline(p.report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
