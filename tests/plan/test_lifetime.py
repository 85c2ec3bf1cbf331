"""Lifetimes on graphs built with the IR: steps, pinning, views, in-place, user constraints,
unplannable values and the stream hook."""
import pytest

from fusegraph.errors import ConfigError
from fusegraph.ir import DType, Graph
from fusegraph.plan.lifetime import LifetimeOptions, compute_lifetimes
from plan_graphs import chain, op

F = 4 * 8 * 4 * 4  # bytes of a (1, 8, 4, 4) float tensor


def test_chain_steps_and_inplace_relu():
    g = chain(4)
    lt = compute_lifetimes(g)
    v = lt.values
    assert (v["x"].kind, v["x"].first, v["x"].last, v["x"].buffer) == ("input", 0, 0, None)
    assert (v["n0"].first, v["n0"].last, v["n0"].kind) == (0, 1, "planned")
    assert v["n1"].kind == "inplace" and v["n1"].buffer == "n0"   # Relu overwrites its dying input
    assert v["n3"].buffer == "n2" and v["n3"].last == 3          # graph output pinned to the end
    assert [(b.name, b.spans) for b in lt.buffers] == [("n0", ((0, 2),)), ("n2", ((2, 3),))]
    assert lt.lower_bound_bytes == 2 * F
    assert lt.inplace == [("n1", "n0", "n1"), ("n3", "n2", "n3")]


def test_no_inplace_when_input_is_read_later_or_is_a_graph_input():
    g = Graph()
    x = g.add_input("x", DType.FLOAT, (2, 3))
    a = op(g, "Relu", [x], (2, 3), name="a")           # x is a graph input: never overwritten
    b = op(g, "Relu", [a], (2, 3), name="b")           # a is read again by c: not in place
    c = op(g, "Add", [a, b], (2, 3), name="c")         # both die here: c takes a's buffer
    g.outputs.append(c)
    lt = compute_lifetimes(g)
    assert lt.values["a"].kind == "planned"
    assert lt.values["b"].kind == "planned"
    assert lt.values["c"].kind == "inplace" and lt.values["c"].buffer == "a"
    assert lt.values["a"].last == 2 and lt.values["c"].last == 2


def test_no_inplace_on_broadcast_shape_mismatch_or_when_disabled():
    g = Graph()
    x = g.add_input("x", DType.FLOAT, (4, 3))
    a = op(g, "Conv", [x], (1, 3), name="a")
    b = op(g, "Add", [a, x], (4, 3), name="b")         # a is smaller than the output
    g.outputs.append(b)
    assert compute_lifetimes(g).values["b"].kind == "planned"
    assert compute_lifetimes(chain(2), options=LifetimeOptions(inplace=False)).values["n1"].kind == "planned"


def test_views_alias_their_source_and_extend_its_life():
    g = Graph()
    x = g.add_input("x", DType.FLOAT, (2, 6))
    a = op(g, "Conv", [x], (2, 6), name="a")           # step 0
    r = op(g, "Reshape", [a], (3, 4), name="r")        # step 1: view of a
    c = op(g, "Conv", [x], (2, 6), name="c")           # step 2
    d = op(g, "Conv", [r, c], (2, 6), name="d")        # step 3: reads the view
    g.outputs.append(d)
    lt = compute_lifetimes(g)
    assert lt.values["r"].kind == "view" and lt.values["r"].buffer == "a"
    assert [b.spans for b in lt.buffers if b.name == "a"] == [((0, 3),)]
    assert "r" not in {b.name for b in lt.buffers}
    assert lt.members["a"] == ["a", "r"]


def test_view_of_input_or_constant_is_not_in_the_arena():
    import torch
    g = Graph()
    x = g.add_input("x", DType.FLOAT, (2, 6))
    w = g.add_constant("w", torch.ones(2, 6))
    vx = op(g, "Flatten", [x], (2, 6), name="vx")
    vw = op(g, "Identity", [w], (2, 6), name="vw")
    g.outputs.append(op(g, "Conv", [vx, vw], (2, 6), name="y"))
    lt = compute_lifetimes(g)
    assert lt.values["vx"].buffer is None and lt.values["vx"].kind == "view"
    assert lt.values["vw"].buffer is None and lt.values["vw"].kind == "const"
    assert [b.name for b in lt.buffers] == ["y"]


def test_dynamic_shapes_are_unplannable_and_listed():
    g = Graph()
    x = g.add_input("x", DType.FLOAT, ("batch", 4))
    a = op(g, "Conv", [x], ("batch", 4), name="a")
    r = op(g, "Reshape", [a], (-1,), name="r")
    r.shape = None
    g.outputs.append(op(g, "Conv", [x], (2, 4), name="b"))
    lt = compute_lifetimes(g)
    names = dict(lt.unplannable)
    assert "not static" in names["a"] and "unplannable" in names["r"]
    assert [b.name for b in lt.buffers] == ["b"]


def test_dead_outputs_live_at_their_step_only():
    g = Graph()
    x = g.add_input("x", DType.FLOAT, (8,))
    y, mask = op(g, "Dropout", [x], (8,), n_out=2, name="drop")
    g.outputs.append(op(g, "Conv", [y], (8,), name="z"))
    lt = compute_lifetimes(g)
    assert (lt.values[mask.name].first, lt.values[mask.name].last) == (0, 0)


def test_user_constraints_override_exclusive_external_reuse_group():
    g = chain(6)  # n0..n5; with in-place: buffers n0 (0-2), n2 (2-4), n4 (4-5)
    opts = LifetimeOptions(tensor_lifetimes=(("n0", 0, 4),), exclusive_tensors=("n2",),
                           external_tensors=("n4",), inplace=False)
    lt = compute_lifetimes(g, options=opts)
    spans = {b.name: b.spans for b in lt.buffers}
    assert spans["n0"] == ((0, 4),) and spans["n4"] == ((4, 5),)
    assert lt.exclusive == frozenset({"n2"})
    narrow = compute_lifetimes(g, options=LifetimeOptions(tensor_lifetimes=(("n2", 3, 3),), inplace=False))
    assert any("widened" in w for w in narrow.warnings)
    grouped = compute_lifetimes(g, options=LifetimeOptions(reuse_groups=(("n0", "n3"),), inplace=False))
    slot = [b for b in grouped.buffers if b.name.startswith("reuse0")]
    assert len(slot) == 1 and slot[0].spans == ((0, 1), (3, 4))
    assert grouped.values["n3"].buffer == slot[0].name


def test_constraint_errors_name_the_problem():
    g = chain(4)
    with pytest.raises(ConfigError, match="not an activation"):
        compute_lifetimes(g, options=LifetimeOptions(exclusive_tensors=("nope",)))
    with pytest.raises(ConfigError, match="live at the same time"):
        compute_lifetimes(g, options=LifetimeOptions(reuse_groups=(("n0", "n1"),), inplace=False))
    with pytest.raises(ConfigError, match="both exclusive and in a reuse group"):
        compute_lifetimes(g, options=LifetimeOptions(reuse_groups=(("n0", "n2"),), exclusive_tensors=("n0",)))


def test_stream_hook_extends_release():
    g = chain(4)
    hook = lambda value, last: last + 1 if value.name == "n0" else last  # noqa: E731
    lt = compute_lifetimes(g, options=LifetimeOptions(inplace=False, release_after=hook))
    assert lt.values["n0"].last == 2
    assert {b.name: b.spans for b in lt.buffers}["n0"] == ((0, 2),)
