"""issue 39 #12: ``algebraic_simplify``'s work grows linearly with an elementwise chain's length.

Work is counted, not timed: the Python lines the pass executes (``sys.settrace`` line events,
which count every loop of the pass, the rule engine and the IR it edits: the name search
of ``Graph._claim_node_name`` and the node-list scans that made it quadratic included) and the
rule checks it makes (rule attempts), run to the fixed point the pipeline's group runs it to.
The counter gives up past a budget, so a quadratic pass fails quickly instead of running for
minutes. The collapsed chain is checked against the unoptimised model."""
from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T, helper as H, numpy_helper as NH

import fusegraph as fg
from fusegraph.frontends.onnx import import_onnx
from fusegraph.ops import infer_graph
from fusegraph.passes import algebra
from fusegraph.passes.manager import PassOptions
from fusegraph.passes.rewrite import RuleSetPass
from fusegraph.passes.rule import Rule

# Add 0.1, Mul 0.9, Sub 0.05, Div 1.1 repeated: a contraction, so 5 000 links stay finite.
LINKS = (("Add", 0.1), ("Mul", 0.9), ("Sub", 0.05), ("Div", 1.1))


def affine_chain(n: int):
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        op, c = LINKS[i % 4]
        inits.append(NH.from_array(np.array([c], np.float32), f"c{i}"))
        nodes.append(H.make_node(op, [prev, f"c{i}"], [f"t{i}"]))
        prev = f"t{i}"
    g = H.make_graph(nodes, "chain", [H.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                     [H.make_tensor_value_info(prev, T.FLOAT, [2, 8])], inits)
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


class _Budget(Exception):
    pass


def pass_work(n: int, budget: int) -> dict:
    """Lines executed and rule checks made by ``algebraic_simplify`` run to its fixed point on an
    ``n``-link chain (raises ``_Budget`` past ``budget`` lines)."""
    graph = import_onnx(affine_chain(n))
    infer_graph(graph)
    work = {"lines": 0, "attempts": 0, "runs": 0}

    def counted(rule: Rule) -> Rule:
        def check(node, ctx):
            work["attempts"] += 1
            return rule.check(node, ctx)
        return Rule(rule.name, check, rule.rewrite, ops=rule.ops, priority=rule.priority, doc=rule.doc)

    rules = RuleSetPass("algebraic_simplify", [counted(r) for r in algebra.RULES], PassOptions())

    def trace(frame, event, arg):
        if event == "line":
            work["lines"] += 1
            if work["lines"] > budget:
                raise _Budget()
        return trace
    sys.settrace(lambda frame, event, arg: trace)
    try:
        while rules.run(graph).changed and work["runs"] < 16:
            work["runs"] += 1
    finally:
        sys.settrace(None)
    work["nodes_left"] = len(graph.nodes)
    return work


def test_algebraic_simplify_work_is_linear_in_the_chain_length():
    """issue 39 #12: doubling a chain of Add / Mul / Sub / Div by constants from 2 500 to 5 000
    links at most ~doubles the pass's work (quadratic would quadruple it), and the chain
    collapses to x * s + t."""
    small = pass_work(2500, budget=2_000_000)
    large = pass_work(5000, budget=5_000_000)
    assert large["nodes_left"] == small["nodes_left"] == 2, (small, large)
    assert large["lines"] <= 2.3 * small["lines"], (small, large)
    assert large["attempts"] <= 2.3 * small["attempts"], (small, large)


def test_collapsed_chain_matches_the_unoptimised_model():
    model = affine_chain(1200)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = fg.compile(model, fg.Config(level="O0")).run({"x": x})["t1199"]
    compiled = fg.compile(model)
    assert compiled.report.nodes_final <= 2
    np.testing.assert_allclose(compiled.run({"x": x})["t1199"], want, rtol=1e-4, atol=1e-6)
