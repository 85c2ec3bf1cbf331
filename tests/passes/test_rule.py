"""The one rule type (passes/rule.py) read the same way by both engines: ``None`` from check is
"not applicable" (nothing recorded), ``Decline(reason)`` declines (recorded with its reason),
anything else applies and is handed to ``rewrite(subject, value, ctx)``; a bare string is
refused, and a rule names root op types or a pattern, not both."""
import pytest

from fusegraph.errors import PassError
from fusegraph.ir import DType, Graph
from fusegraph.passes import PassOptions
from fusegraph.passes.fusion import FusionPass, Pat, Var
from fusegraph.passes.rewrite import RuleSetPass
from fusegraph.passes.rule import Decline, Rule


def _sigmoid_relu():
    g = Graph("t")
    x = g.add_input("x", DType.FLOAT, (2, 3))
    s = g.add_node("Sigmoid", [x])
    r = g.add_node("Relu", [s.outputs[0]])
    for n in (s, r):
        n.outputs[0].dtype, n.outputs[0].shape = DType.FLOAT, (2, 3)
    g.outputs.append(r.outputs[0])
    return g, x, s, r


# check's value reaches rewrite: here a 1-tuple holding the op type to emit
def _op_rule(check):
    return Rule("relu_to_tanh", check, lambda node, value, ctx: ctx.emit(value[0], [node.inputs[0]]),
                ops=("Relu",))


def _pattern_rule(check):
    return Rule("sig_relu", check, lambda m, value, ctx: ctx.emit(value[0], [m.values["x"]]),
                pattern=Pat("Relu", Pat("Sigmoid", Var("x"))))


@pytest.mark.parametrize("kind", ["ops", "pattern"])
def test_one_convention_in_both_engines(kind):
    make = _op_rule if kind == "ops" else _pattern_rule

    def run(check):
        g, *_ = _sigmoid_relu()
        log = []
        rule = make(check)
        engine = RuleSetPass("t", [rule], PassOptions(), log) if kind == "ops" else \
            FusionPass(PassOptions(), log, rules=[rule])
        return engine.run(g), log, [n.op_type for n in g.nodes]

    res, log, ops = run(lambda subject, ctx: None)            # not applicable: silent
    assert not res.changed and log == [] and ops == ["Sigmoid", "Relu"] and not res.stats
    res, log, ops = run(lambda subject, ctx: Decline("not today"))
    assert not res.changed and ops == ["Sigmoid", "Relu"]
    assert [(r["applied"], r["reason"]) for r in log] == [(False, "not today")]
    assert res.stats["declined"] == {log[0]["rule"]: 1}
    with pytest.raises(PassError, match="Decline"):   # a bare string is a bug, not a go
        run(lambda subject, ctx: "why not")
    res, log, ops = run(lambda subject, ctx: ("Tanh",))
    assert res.changed and ops[-1] == "Tanh" and [r["applied"] for r in log] == [True]
    assert res.stats["applied"] == {log[0]["rule"]: 1}


def test_rule_shape_is_checked():
    check, rewrite = (lambda s, ctx: True), (lambda s, v, ctx: None)
    with pytest.raises(ValueError):
        Rule("both", check, rewrite, ops=("Relu",), pattern=Pat("Relu", Var("x")))
    with pytest.raises(ValueError):
        Rule("neither", check, rewrite)
    with pytest.raises(TypeError):
        Rule("old_order", ("Relu",), check, rewrite)
    with pytest.raises(PassError):
        RuleSetPass("t", [Rule("p", check, rewrite, pattern=Pat("Relu", Var("x")))], PassOptions())
    with pytest.raises(PassError):
        FusionPass(PassOptions(), [], rules=[Rule("o", check, rewrite, ops=("Relu",))])
