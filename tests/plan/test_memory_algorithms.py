"""Invariants of the offset planner on random interval sets (hypothesis): no two buffers live
at the same time overlap, offsets are aligned, the arena is never below the lower bound, the
best-of result is no worse than any single algorithm, and the exact solver is no worse still."""
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegraph.plan import memory
from fusegraph.plan.memory import Buffer, Constraints, check_assignment, lower_bound, plan

HEURISTICS = [a for a in memory.DEFAULT_ALGORITHMS if a != "exact"]


@st.composite
def problems(draw, max_buffers=30, max_step=40):
    n = draw(st.integers(0, max_buffers))
    buffers = []
    for i in range(n):
        start = draw(st.integers(0, max_step))
        spans = [(start, start + draw(st.integers(0, 10)))]
        if draw(st.integers(0, 9)) == 0:  # a reuse-group slot: a second, later span
            s2 = spans[0][1] + 1 + draw(st.integers(0, 5))
            spans.append((s2, s2 + draw(st.integers(0, 5))))
        size = draw(st.sampled_from([0, 1, 7, 63, 64, 65, 100, 1000, 4096, 10000]))
        buffers.append(Buffer(f"b{i}", size, tuple(spans)))
    excl = frozenset(b.name for b in buffers if draw(st.integers(0, 19)) == 0)
    return buffers, Constraints(alignment=draw(st.sampled_from([1, 16, 64])), exclusive=excl,
                                exact_time_limit_s=0.2, exact_max_buffers=12)


def _overlap_free(buffers, offsets, constraints):
    check_assignment(buffers, offsets, constraints)  # raises on overlap / misalignment
    # an independent, brute-force re-check of the same invariant
    for a in buffers:
        for b in buffers:
            if a is b or not a.size or not b.size:
                continue
            live_together = (a.name in constraints.exclusive or b.name in constraints.exclusive or any(
                s <= e2 and s2 <= e for s, e in a.spans for s2, e2 in b.spans))
            if live_together:
                oa, ob = offsets[a.name], offsets[b.name]
                assert oa + a.size <= ob or ob + b.size <= oa


@settings(max_examples=60, deadline=None)
@given(problems())
def test_every_algorithm_is_overlap_free_aligned_and_above_the_lower_bound(problem):
    buffers, constraints = problem
    lb = lower_bound(buffers, constraints)
    for name in HEURISTICS + ["naive"]:
        offsets = memory.ALGORITHMS[name](buffers, constraints)
        assert set(offsets) == {b.name for b in buffers}
        _overlap_free(buffers, offsets, constraints)
        assert all(o % constraints.alignment == 0 for o in offsets.values())
        assert memory.arena_of(buffers, offsets, constraints.alignment) >= lb


@settings(max_examples=40, deadline=None)
@given(problems(max_buffers=12, max_step=15))
def test_plan_keeps_the_smallest_and_exact_is_no_worse(problem):
    buffers, constraints = problem
    result = plan(buffers, constraints)
    _overlap_free(buffers, result.offsets, constraints)
    assert result.arena_bytes >= lower_bound(buffers, constraints)
    assert result.arena_bytes % constraints.alignment == 0
    for name in HEURISTICS:
        arena = memory.arena_of(buffers, memory.ALGORITHMS[name](buffers, constraints), constraints.alignment)
        assert result.arena_bytes <= arena
    assert result.arena_bytes == min(result.candidates.values(), default=0)


def test_exclusive_buffer_shares_with_nobody():
    buffers = [Buffer("a", 100, ((0, 1),)), Buffer("b", 100, ((2, 3),)), Buffer("c", 100, ((4, 5),))]
    assert plan(buffers).arena_bytes == 128  # a, b, c reuse one slot
    result = plan(buffers, Constraints(exclusive=frozenset({"b"})))
    assert result.arena_bytes == 256
    ob = result.offsets["b"]
    assert all(result.offsets[n] + 100 <= ob or ob + 100 <= result.offsets[n] for n in "ac")


def test_exact_solver_reaches_the_lower_bound_on_a_tight_case():
    # 6 alignment units live at steps 1-3; a packing of exactly 6 units exists
    buffers = [Buffer("A", 64 * 2, ((0, 1),)), Buffer("B", 64 * 3, ((1, 2),)), Buffer("C", 64 * 2, ((2, 3),)),
               Buffer("D", 64 * 3, ((3, 4),)), Buffer("E", 64 * 1, ((0, 4),))]
    lb = lower_bound(buffers)
    result = plan(buffers, Constraints(exact_time_limit_s=2.0))
    assert result.arena_bytes >= lb
    pytest.importorskip("ortools")
    exact = memory.exact(buffers, Constraints(exact_time_limit_s=2.0))
    assert exact is not None
    assert memory.arena_of(buffers, exact) == result.arena_bytes == lb  # 6 units live at most


def test_milp_fallback_agrees_with_cpsat_on_a_small_case():
    pytest.importorskip("scipy")
    from fusegraph.plan import exact as ex
    buffers = [Buffer(f"b{i}", s, ((a, b),)) for i, (s, a, b) in
               enumerate([(300, 0, 3), (200, 1, 2), (500, 2, 5), (100, 4, 6), (400, 5, 7), (250, 0, 7)])]
    c = Constraints(exact_time_limit_s=2.0)
    adj = memory.conflicts(buffers, c)
    offsets, proven = ex._milp(buffers, c, adj, list(range(len(buffers))), None)
    check_assignment(buffers, offsets, c)
    assert proven
    assert memory.arena_of(buffers, offsets) == plan(buffers, c).arena_bytes


@settings(max_examples=40, deadline=None)
@given(problems(max_buffers=10, max_step=12))
def test_cpsat_wrappers_agree_with_cp_model(problem):
    """The text-format model solved through ortools' C++ wrappers reaches the optimum that its
    ``cp_model`` module (the path before ortools 9.12) proves, in a valid packing."""
    pytest.importorskip("ortools")
    from fusegraph.plan import exact as ex
    buffers, c = problem
    c = Constraints(alignment=c.alignment, exclusive=c.exclusive, exact_time_limit_s=5.0)
    live = [i for i, b in enumerate(buffers) if b.size > 0]
    if not live:
        return
    adj = memory.conflicts(buffers, c)
    hint = memory.plan(buffers, c, algorithms=HEURISTICS).offsets
    wrapped, reference = ex._cpsat(buffers, c, adj, live, hint), ex._cpsat_model(buffers, c, live, hint)
    assert wrapped is not None and reference is not None
    check_assignment(buffers, wrapped[0], c)
    if wrapped[1] and reference[1]:
        assert memory.arena_of(buffers, wrapped[0], c.alignment) == memory.arena_of(buffers, reference[0], c.alignment)


def test_exact_solver_imports_no_pandas():
    """ortools' ``cp_model`` imports pandas (~30 MiB private for the process's life); the
    planner builds its model without it."""
    pytest.importorskip("ortools")
    code = ("import sys\n"
            "from fusegraph.plan.memory import Buffer, Constraints, exact\n"
            "b = [Buffer('A', 128, ((0, 1),)), Buffer('B', 192, ((1, 2),)), Buffer('C', 64, ((0, 2),))]\n"
            "assert exact(b, Constraints(exact_time_limit_s=2.0)) is not None\n"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_conflict_graph_exports_as_json():
    buffers = [Buffer("a", 10, ((0, 2),)), Buffer("b", 10, ((2, 3),)), Buffer("c", 10, ((4, 4),))]
    data = json.loads(memory.conflict_graph_json(buffers))
    assert data["edges"] == [["a", "b"]]
    assert [n["name"] for n in data["nodes"]] == ["a", "b", "c"]


def test_lower_bound_and_empty_problem():
    assert lower_bound([]) == 0
    assert plan([]).arena_bytes == 0
    buffers = [Buffer("a", 10, ((0, 2),)), Buffer("b", 20, ((1, 1),)), Buffer("c", 5, ((2, 4),))]
    assert lower_bound(buffers) == 30


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="unknown memory planning algorithm"):
        plan([Buffer("a", 1, ((0, 0),))], algorithms=["magic"])
