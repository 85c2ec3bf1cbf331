"""IR invariants: use-def links, removal, topological order, verify messages, printer."""
import pytest
import torch

from fusegraph.errors import VerifyError
from fusegraph.ir import DType, Graph, broadcast_shapes


def _chain():
    g = Graph("t")
    x = g.add_input("x", DType.FLOAT, ("N", 4))
    c = g.add_constant("c", torch.ones(4))
    a = g.add_node("Add", [x, c], name="add")
    r = g.add_node("Relu", [a.outputs[0]], name="relu")
    g.outputs.append(r.outputs[0])
    return g, x, c, a, r


def test_use_def_links_follow_rewiring():
    g, x, c, a, r = _chain()
    assert [n.name for n in x.users] == ["add"]
    assert c.uses == [(a, 1)]
    r.set_input(0, x)
    assert a.outputs[0].uses == []
    assert {n.name for n in x.users} == {"add", "relu"}
    g.verify()


def test_replace_all_uses_with_moves_graph_outputs_too():
    g, x, c, a, r = _chain()
    r.outputs[0].replace_all_uses_with(a.outputs[0])
    assert g.outputs[0] is a.outputs[0]
    g.remove(r)
    g.verify()
    assert [n.op_type for n in g.nodes] == ["Add"]


def test_safe_remove_refuses_used_node():
    g, x, c, a, r = _chain()
    with pytest.raises(ValueError, match="still used by relu"):
        g.remove(a)


def test_verify_reports_order_violation_with_context_and_fix():
    g, x, c, a, r = _chain()
    g.nodes.reverse()
    with pytest.raises(VerifyError) as info:
        g.verify()
    msg = str(info.value)
    assert "later in the node list" in msg and "how to fix" in msg and ">>" in msg
    g.toposort()
    g.verify()


def test_verify_catches_stale_use():
    g, x, c, a, r = _chain()
    g.nodes.remove(r)  # removed by hand: the use of %add stays behind
    r.graph = None
    with pytest.raises(VerifyError, match="stale use"):
        g.verify()


def test_fresh_names_are_unique():
    g = Graph()
    names = {g.new_value("t").name for _ in range(50)}
    assert len(names) == 50


def test_add_node_before_keeps_order_valid():
    g, x, c, a, r = _chain()
    neg = g.add_node("Neg", [x], name="neg", before=a)
    a.set_input(0, neg.outputs[0])
    g.verify()
    assert [n.op_type for n in g.nodes] == ["Neg", "Add", "Relu"]


def test_printer_shows_types_and_ops():
    g, *_ = _chain()
    text = str(g)
    assert "input  %x: f32[N,4]" in text and "Relu(" in text and "return %" in text


def test_broadcast_shapes_symbolic_and_static():
    assert broadcast_shapes(("N", 1, 4), (3, 1)) == ("N", 3, 4)
    assert broadcast_shapes((2, 3), (3,)) == (2, 3)
    with pytest.raises(ValueError):
        broadcast_shapes((2, 3), (4,))
