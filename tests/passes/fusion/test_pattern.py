"""The fusion pattern matcher (passes/fusion/pattern.py) and engine (engine.py) on small IR graphs:
op types and alternatives, commutativity, shared sub-patterns, single use, attribute
predicates, optional and trailing inputs, external / no_fuse blocking (with the reason), and
that the engine records applied and declined candidates and tags what it creates."""
import torch

from fusegraph.ir import DType, Graph
from fusegraph.passes import PassOptions
from fusegraph.passes.fusion import Const, Decline, FusionPass, Pat, Rule, Var, explain, match
from fusegraph.passes.fusion.engine import collect_rules


def _graph():
    g = Graph("t")
    x = g.add_input("x", DType.FLOAT, (2, 3))
    return g, x


def _op(g, op, *ins, **attrs):
    n = g.add_node(op, list(ins), attrs=attrs)
    n.outputs[0].dtype, n.outputs[0].shape = DType.FLOAT, (2, 3)
    return n


def test_op_alternatives_and_capture():
    g, x = _graph()
    s = _op(g, "Sigmoid", x)
    r = _op(g, "Relu", s.outputs[0])
    m = match(Pat(("Relu", "Tanh"), Pat("Sigmoid", Var("v"), name="sig")), r)
    assert m is not None and m.nodes == {"root": r, "sig": s} and m.values["v"] is x
    assert m.matched == [s, r] and m.root is r
    assert match(Pat("Tanh", Var("v")), r) is None


def test_commutative_both_orders_and_shared_var():
    g, x = _graph()
    s = _op(g, "Sigmoid", x)
    for order in ((x, s.outputs[0]), (s.outputs[0], x)):
        mul = _op(g, "Mul", *order)
        m = match(Pat("Mul", Var("a"), Pat("Sigmoid", Var("a"), single_use=False)), mul)
        assert m is not None and m.values["a"] is x
    sub = _op(g, "Sub", s.outputs[0], x)  # not commutative: order matters
    assert match(Pat("Sub", Var("a"), Pat("Sigmoid", Var("a"), single_use=False)), sub) is None
    other = g.add_input("y", DType.FLOAT, (2, 3))
    mul = _op(g, "Mul", other, s.outputs[0])  # a shared Var must bind one value
    assert match(Pat("Mul", Var("a"), Pat("Sigmoid", Var("a"), single_use=False)), mul) is None


def test_shared_named_node_and_single_use():
    g, x = _graph()
    c = _op(g, "Relu", x)
    s = _op(g, "Sigmoid", c.outputs[0])
    mul = _op(g, "Mul", c.outputs[0], s.outputs[0])
    conv = Pat("Relu", Var("x"), name="c")
    pat = Pat("Mul", conv, Pat("Sigmoid", conv))
    m = match(pat, mul)
    assert m is not None and m.nodes["c"] is c and len(m.matched) == 3
    _op(g, "Tanh", c.outputs[0])  # a consumer outside the pattern: c is no longer single-use
    assert match(pat, mul) is None and explain(pat, mul) is None


def test_attrs_consts_optional_and_trailing_inputs():
    g, x = _graph()
    k = g.add_constant("k", torch.ones(3))
    n = _op(g, "LeakyRelu", x, alpha=0.1)
    assert match(Pat("LeakyRelu", Var("x"), attrs={"alpha": 0.1}), n) is not None
    assert match(Pat("LeakyRelu", Var("x"), attrs={"alpha": lambda a: a is not None and a > 0.5}), n) is None
    assert match(Pat("LeakyRelu", Var("x"), attrs={"beta": 1.0}), n) is None   # missing attribute
    add = _op(g, "Add", x, k)
    m = match(Pat("Add", Var("x"), Const("k", lambda t: bool((t == 1).all()))), add)
    assert m is not None and m.values["k"] is k and torch.equal(m.const("k"), torch.ones(3))
    assert match(Pat("Add", Const("k"), Const("k2")), add) is None
    clip = _op(g, "Clip", x, k, k)
    assert match(Pat("Clip", Var("x")), clip) is None                    # counts must agree ...
    assert match(Pat("Clip", Var("x"), ...), clip) is not None           # ... unless open
    relu = _op(g, "Relu", x)
    m = match(Pat("Relu", Var("x"), Var("b", optional=True)), relu)
    assert m is not None and m.values["b"] is None
    assert match(Pat("Relu"), relu) is not None                          # no inputs: not checked


def test_external_and_no_fuse_block_with_reason():
    g, x = _graph()
    s = _op(g, "Sigmoid", x)
    r = _op(g, "Relu", s.outputs[0])
    pat = Pat("Relu", Pat("Sigmoid", Var("x")))
    s.outputs[0].flags.add("external")
    assert match(pat, r) is None and "external" in explain(pat, r)
    s.outputs[0].flags.clear()
    r.outputs[0].flags.add("external")       # the root's own output may be external
    assert match(pat, r) is not None
    s.outputs[0].flags.add("no_fuse")
    assert match(pat, r) is None and "no_fuse" in explain(pat, r)
    s.outputs[0].flags.clear()
    g.outputs.append(s.outputs[0])            # an interior graph output cannot be fused away
    assert match(pat, r) is None and "graph output" in explain(pat, r)


def _sig_relu_rule(check=lambda m, ctx: True):
    def rewrite(m, _, ctx):
        return ctx.emit("HardSigmoid", [m.values["x"]], {"alpha": 0.5})
    return Rule("demo", check, rewrite, pattern=Pat("Relu", Pat("Sigmoid", Var("x"))), priority=5)


def test_engine_applies_records_and_tags():
    g, x = _graph()
    s = _op(g, "Sigmoid", x)
    r = _op(g, "Relu", s.outputs[0])
    r.outputs[0].flags.add("external")
    g.outputs.append(r.outputs[0])
    log = []
    res = FusionPass(PassOptions(), log, rules=[_sig_relu_rule()]).run(g)
    assert res.changed and [n.op_type for n in g.nodes] == ["HardSigmoid"]
    new = g.nodes[0]
    assert new.meta["rule"] == "demo" and g.outputs[0] is new.outputs[0]
    assert new.outputs[0].name == r.outputs[0].name and "external" in new.outputs[0].flags
    assert [(r["rule"], r["applied"], r["nodes"]) for r in log] == [("demo", True, [s.name, r.name])]
    g.verify()


def test_engine_declines_with_reasons_and_respects_disabled():
    g, x = _graph()
    s = _op(g, "Sigmoid", x)
    r = _op(g, "Relu", s.outputs[0])
    g.outputs.append(r.outputs[0])
    log = []
    FusionPass(PassOptions(), log, rules=[_sig_relu_rule(lambda m, ctx: Decline("not today"))]).run(g)
    assert [n.op_type for n in g.nodes] == ["Sigmoid", "Relu"]
    assert [(r["rule"], r["applied"], r["nodes"], r["reason"]) for r in log] == \
        [("demo", False, [s.name, r.name], "not today")]
    s.outputs[0].flags.add("no_fuse")
    log.clear()
    FusionPass(PassOptions(), log, rules=[_sig_relu_rule()]).run(g)
    assert len(log) == 1 and not log[0]["applied"] and "no_fuse" in log[0]["reason"]
    s.outputs[0].flags.clear()
    FusionPass(PassOptions(disabled=frozenset({"demo"})), log, rules=[_sig_relu_rule()]).run(g)
    assert [n.op_type for n in g.nodes] == ["Sigmoid", "Relu"]


def test_rules_are_collected_by_priority():
    rules = collect_rules()
    names = {r.name for r in rules}
    assert {"conv_add", "conv_relu", "conv_prepack", "conv_bn"} <= names
    prios = [r.priority for r in rules]
    assert prios == sorted(prios, reverse=True)
