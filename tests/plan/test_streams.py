"""The stream planner (plan/streams.py) and its cost model (plan/cost.py).

Invariants on random DAGs, checked by code independent of the planner: every node on exactly
one stream; per-stream order consistent with the given order; every cross-stream edge ordered
by waits (happens-before reachability); no wait removable; a time-driven simulation of the plan
(streams as workers, events fire when their producer finishes) never starts a consumer before
its producers finish, never deadlocks, and finishes within the sequential sum; hybrid plans
(measured per-thread costs) also keep every wide node alone (ordered against every node of
the other streams, and alone in the simulation). Then hand-made graphs, the cost model, the
branchy light models and ``fusegraph inspect --streams``.
"""
from __future__ import annotations

import heapq
import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_graphs import branchy, chain, op

from fusegraph.ir import DType, Graph
from fusegraph.plan.cost import CostModel, MeasuredCosts, node_work
from fusegraph.plan.streams import plan_streams

SHAPE = (1, 4, 8, 8)


# ----- independent checkers ---------------------------------------------------------------
def data_edges(order):
    index = {id(n): i for i, n in enumerate(order)}
    edges = set()
    for i, n in enumerate(order):
        for v in n.inputs:
            if v is not None and v.producer is not None and id(v.producer) in index:
                edges.add((index[id(v.producer)], i))
    return edges


def happens_before(order, plan, waits):
    """reach[i]: bitset of nodes guaranteed finished before node i starts (stream order + waits)."""
    pos = {n.name: i for i, n in enumerate(order)}
    producer = {e.id: pos[e.producer] for e in plan.events}
    incoming = {i: set() for i in range(len(order))}
    for names in plan.per_stream:
        for a, b in zip(names, names[1:]):
            incoming[pos[b]].add(pos[a])
    for name, ids in waits.items():
        incoming[pos[name]].update(producer[e] for e in ids)
    reach = [0] * len(order)
    for i in range(len(order)):          # every edge points forward in ``order`` (checked below)
        for j in incoming[i]:
            assert j < i, f"{order[i].name} synchronises with a later node {order[j].name}"
            reach[i] |= reach[j] | (1 << j)
    return reach


def uncovered(order, plan, waits):
    """Cross-stream data edges not ordered, and (hybrid plans) pairs of a wide node and a node
    on another stream that are not ordered either way (they could run at the same time)."""
    reach = happens_before(order, plan, waits)
    bad = [(p, c) for p, c in data_edges(order)
           if plan.stream_of[order[p].name] != plan.stream_of[order[c].name] and not reach[c] >> p & 1]
    wide = set(getattr(plan, "wide", ()))
    for w, node in enumerate(order):
        if node.name in wide:
            bad += [(x, w) for x in range(len(order)) if plan.stream_of[order[x].name] != plan.stream_of[node.name]
                    and not reach[w] >> x & 1 and not reach[x] >> w & 1]
    return bad


def simulate(order, plan, cost):
    """Time-driven simulation: returns (start, finish) per name; fails on deadlock."""
    producer = {e.id: e.producer for e in plan.events}
    finish, start = {}, {}
    heads = [0] * plan.num_streams
    busy: list = []                       # heap of (finish time, stream, name)
    now = 0.0
    idle = set(range(plan.num_streams))
    while True:
        for k in sorted(idle):
            if heads[k] < len(plan.per_stream[k]):
                name = plan.per_stream[k][heads[k]]
                if all(producer[e] in finish and finish[producer[e]] <= now for e in plan.waits.get(name, [])):
                    start[name] = now
                    heapq.heappush(busy, (now + cost[name], k, name))
                    idle.discard(k)
        if not busy:
            break
        now, k, name = heapq.heappop(busy)
        finish[name] = now
        heads[k] += 1
        idle.add(k)
    assert len(finish) == len(order), f"deadlock: ran {len(finish)} of {len(order)} nodes"
    return start, finish


def check_plan(graph, order, plan, cost=None):
    names = [n.name for n in order]
    pos = {n: i for i, n in enumerate(names)}
    flat = [n for s in plan.per_stream for n in s]
    assert sorted(flat) == sorted(names), "every node in exactly one stream"
    assert len(plan.per_stream) == plan.num_streams and all(plan.per_stream)
    for k, s in enumerate(plan.per_stream):
        assert all(plan.stream_of[n] == k for n in s)
        assert [pos[n] for n in s] == sorted(pos[n] for n in s), "stream order follows the given order"
    assert [e.id for e in plan.events] == list(range(len(plan.events)))
    for e in plan.events:
        assert plan.records[e.producer] == e.id and e.stream == plan.stream_of[e.producer]
    assert len(plan.records) == len(plan.events)
    waited = {e for ids in plan.waits.values() for e in ids}
    assert waited == set(range(len(plan.events))), "every event is waited on"
    by_id = {e.id: e for e in plan.events}
    for name, ids in plan.waits.items():
        for e in ids:
            assert by_id[e].stream != plan.stream_of[name], "waits only cross streams"
    assert not uncovered(order, plan, plan.waits), "every cross-stream edge is ordered"
    for name, ids in plan.waits.items():
        for e in ids:
            fewer = dict(plan.waits)
            fewer[name] = [x for x in ids if x != e]
            assert uncovered(order, plan, fewer), f"wait of {name} on event {e} is redundant"
    cost = plan.cost if cost is None else cost
    start, finish = simulate(order, plan, cost)
    for p, c in data_edges(order):
        assert start[names[c]] >= finish[names[p]], f"{names[c]} started before {names[p]} finished"
    for w in getattr(plan, "wide", ()):           # a wide node has the machine to itself
        assert plan.stream_of[w] == 0
        for x in names:
            if x != w and cost[w] > 0 and cost[x] > 0:
                assert finish[x] <= start[w] or start[x] >= finish[w], f"{x} runs beside the wide node {w}"
    assert max(finish.values(), default=0.0) <= sum(cost[n] for n in names) + 1e-6
    json.dumps(plan.to_dict())


# ----- random DAGs --------------------------------------------------------------------------
@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 28))
    g = Graph("random")
    values = [g.add_input("x", DType.FLOAT, SHAPE)]
    weight = g.add_constant("w", torch.zeros(4, 4, 3, 3))
    for i in range(n):
        k = draw(st.integers(1, 3))
        ins = [values[draw(st.integers(max(0, len(values) - 8), len(values) - 1))] for _ in range(k)]
        if k == 1 and draw(st.booleans()):
            values.append(op(g, "Conv", [ins[0], weight], SHAPE, name=f"n{i}"))
        else:
            values.append(op(g, "Relu" if k == 1 else "Sum", ins, SHAPE, name=f"n{i}"))
    g.outputs.append(values[-1])
    rng = random.Random(draw(st.integers(0, 2**16)))
    order, done, pending = [], set(), list(g.nodes)
    while pending:                       # a random topological order
        ready = [m for m in pending if all(v.producer is None or id(v.producer) in done
                                           for v in m.inputs if v is not None)]
        m = rng.choice(ready)
        pending.remove(m)
        order.append(m)
        done.add(id(m))
    costs = {m.name: draw(st.floats(0.0, 100.0)) for m in g.nodes}
    wide = {m.name: costs[m.name] * draw(st.floats(0.3, 1.5)) for m in g.nodes}
    return g, order, costs, wide


def snapshot(graph):
    return [(n.name, n.op_type, [id(v) for v in n.inputs], [id(v) for v in n.outputs]) for n in graph.nodes]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.sampled_from([1, 2, 3, 5, "auto"]), st.sampled_from(["fixed", "model", "measured"]),
       st.sampled_from([2, 4]))
def test_random_dags_invariants(dag, streams, kind, cores):
    """Also hybrid plans ("measured": per-thread costs, "auto"): wide nodes run alone."""
    graph, order, costs, wide = dag
    before = snapshot(graph)
    fixed = kind == "fixed"
    cost = {"fixed": costs, "model": CostModel(device="cpu", cores=4, threads=4, sync_us=5.0),
            "measured": MeasuredCosts({1: costs, cores: wide}, cores=cores, sync_us=3.0, contention=1.0)}[kind]
    plan = plan_streams(graph, order, streams, cost)
    assert snapshot(graph) == before, "the planner never mutates the graph"
    check_plan(graph, order, plan, costs if fixed else None)
    if streams == "auto":
        assert plan.estimated_time <= plan.sequential_time + 1e-6
    if isinstance(streams, int):
        assert plan.num_streams <= streams
    if streams == 1:
        assert plan.num_streams == 1 and not plan.events and not plan.records


# ----- hand-made graphs -----------------------------------------------------------------------
def diamond():
    g = Graph("diamond")
    x = g.add_input("x", DType.FLOAT, SHAPE)
    a = op(g, "Relu", [x], SHAPE, name="a")
    b = op(g, "Relu", [a], SHAPE, name="b")
    c = op(g, "Relu", [a], SHAPE, name="c")
    g.outputs.append(op(g, "Add", [b, c], SHAPE, name="d"))
    return g


def test_diamond_splits_heavy_branches():
    g = diamond()
    plan = plan_streams(g, g.nodes, 2, {"a": 1, "b": 100, "c": 100, "d": 1})
    check_plan(g, g.nodes, plan)
    assert plan.num_streams == 2 and plan.stream_of["b"] != plan.stream_of["c"]
    assert len(plan.events) == 2                 # the far branch waits on a; d waits on it
    assert plan.critical_path == pytest.approx(102) and plan.total_work == pytest.approx(202)
    assert plan.estimated_parallelism == pytest.approx(202 / 102)
    assert plan.estimated_time == pytest.approx(102)


def test_chain_stays_on_one_stream():
    g = chain(8)
    plan = plan_streams(g, g.nodes, 4, {n.name: 10.0 for n in g.nodes})
    assert plan.num_streams == 1 and not plan.events
    assert plan.critical_path == pytest.approx(80) and plan.estimated_parallelism == pytest.approx(1)


def test_auto_keeps_one_stream_when_sync_costs_more():
    g = diamond()
    tiny = CostModel(device="cpu", cores=2, threads=2, dispatch_us=6.0, sync_us=30.0)
    plan = plan_streams(g, g.nodes, "auto", tiny)
    assert plan.num_streams == 1 and not plan.events
    assert plan.candidates[1] == pytest.approx(plan.estimated_time)


def test_auto_uses_streams_when_branches_are_heavy():
    g = branchy(width=4)
    costs = {n.name: (1000.0 if n.name.startswith(("expand", "reduce")) else 10.0) for n in g.nodes}
    plan = plan_streams(g, g.nodes, "auto", costs)
    check_plan(g, g.nodes, plan)
    assert plan.num_streams == 4 and plan.estimated_time < plan.sequential_time / 3
    for i in range(4):                           # each branch is a chain: one stream
        assert plan.stream_of[f"expand{i}"] == plan.stream_of[f"reduce{i}"]


def fork_join(width: int = 4):
    """stem -> ``width`` two-node branches -> Concat -> head."""
    g = Graph("forkjoin")
    x = g.add_input("x", DType.FLOAT, SHAPE)
    h = op(g, "Relu", [x], SHAPE, name="stem")
    ends = [op(g, "Relu", [op(g, "Relu", [h], SHAPE, name=f"a{i}")], SHAPE, name=f"b{i}") for i in range(width)]
    cat = op(g, "Concat", ends, SHAPE, name="cat")
    g.outputs.append(op(g, "Relu", [cat], SHAPE, name="head"))
    return g


def test_auto_hybrid_runs_big_nodes_wide_and_branches_narrow():
    """Stem and head scale with threads (2x on 2 cores), the branches do not: the stem and
    head run alone with both threads, the branches on two one-thread streams."""
    g = fork_join()
    one = {n.name: (200.0 if n.name in ("stem", "head") else 20.0) for n in g.nodes}
    two = {n.name: (100.0 if n.name in ("stem", "head") else 19.0) for n in g.nodes}
    cost = MeasuredCosts({1: one, 2: two}, cores=2, sync_us=2.0, contention=1.0)
    plan = plan_streams(g, g.nodes, "auto", cost)
    check_plan(g, g.nodes, plan)
    assert plan.num_streams == 2 and plan.algorithm.startswith("hybrid")
    assert {"stem", "head"} <= set(plan.wide)
    assert not {f"a{i}" for i in range(4)} & set(plan.wide)
    assert {plan.stream_of[f"a{i}"] for i in range(4)} == {0, 1}
    assert plan.estimated_time < plan.sequential_time == pytest.approx(sum(cost.node_us_at(n, 2) for n in g.nodes))
    assert cost.node_us_at(g.nodes[1], 2) < 19.0        # 2 threads capped by the one-thread time's scaling
    assert plan.to_dict()["wide"] == plan.wide


def test_region_cuts_are_where_the_graph_narrows_to_one_value():
    from fusegraph.plan.stream_hybrid import region_cuts
    from fusegraph.plan.streams import Dag
    g = fork_join()
    names = [n.name for n in g.nodes]
    assert names[0] == "stem" and names[-2:] == ["cat", "head"]
    assert region_cuts(Dag(g.nodes)) == [0, 1, len(names) - 1, len(names)]


def test_auto_keeps_one_stream_when_every_node_scales():
    g = fork_join()
    one = {n.name: 100.0 for n in g.nodes}
    two = {n.name: 52.0 for n in g.nodes}
    plan = plan_streams(g, g.nodes, "auto", MeasuredCosts({1: one, 2: two}, cores=2, sync_us=10.0))
    assert plan.num_streams == 1 and not plan.events and not plan.wide


def test_bad_arguments():
    g = diamond()
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(ValueError):
            plan_streams(g, g.nodes, bad)
    with pytest.raises(ValueError):
        plan_streams(g, list(reversed(g.nodes)), 2)


# ----- cost model -------------------------------------------------------------------------------
def test_cost_model_counts_conv_flops_and_views():
    g = Graph("c")
    x = g.add_input("x", DType.FLOAT, (1, 8, 16, 16))
    w = g.add_constant("w", torch.zeros(32, 8, 3, 3))
    y = op(g, "Conv", [x, w], (1, 32, 16, 16), name="conv")
    r = op(g, "Reshape", [y, g.add_constant("s", torch.tensor([1, -1]))], (1, 32 * 256), name="view")
    m = op(g, "MatMul", [r, g.add_constant("m", torch.zeros(32 * 256, 10))], (1, 10), name="mm")
    conv, view, mm = g.nodes
    assert node_work(conv).flops == 2 * 32 * 16 * 16 * 8 * 9
    assert node_work(view).bytes == 0 and node_work(view).flops == 0
    assert node_work(mm).flops == 2 * 10 * 32 * 256
    model = CostModel.for_device("cpu", cores=2)
    assert model.node_us(view) == model.dispatch_us
    one = model.for_streams(2)
    assert one.threads == 1 and model.threads == 2
    assert one.compute_us(conv) > model.compute_us(conv) > one.compute_us(conv) / 2
    assert m is not None and CostModel.for_device("cuda").device == "cuda"


# ----- the branchy light models -----------------------------------------------------------------
@pytest.fixture(scope="module")
def light_graphs():
    import fusegraph as fg
    from fusegraph.testing.zoo import light_model_path
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = fg.compile(str(light_model_path(name)), fg.Config(level="O0")).graph
        return cache[name]
    return load


@pytest.mark.parametrize("name", ["inception_v1", "inception_v2", "squeezenet", "densenet121"])
def test_light_models_have_parallelism(light_graphs, name):
    g = light_graphs(name)
    before = snapshot(g)
    auto = plan_streams(g, g.nodes, "auto", CostModel.for_device("cpu", cores=2))
    assert auto.estimated_parallelism > 1.0
    assert auto.estimated_time <= auto.sequential_time + 1e-6
    two = plan_streams(g, g.nodes, 2, CostModel.for_device("cpu", cores=2))
    assert two.num_streams == 2 and two.events
    fast = plan_streams(g, g.nodes, 4, CostModel.for_device("cuda"))
    for plan in (auto, two, fast):
        if len(g.nodes) <= 300:              # the quadratic redundancy check stays cheap
            check_plan(g, g.nodes, plan)
        else:
            assert not uncovered(g.nodes, plan, plan.waits)
            simulate(g.nodes, plan, plan.cost)
    assert snapshot(g) == before


def test_inspect_streams_cli(capsys):
    from fusegraph.cli.main import main
    from fusegraph.testing.zoo import light_model_path
    assert main(["inspect", str(light_model_path("squeezenet")), "--streams", "--num-streams", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("streams: ") and "critical path" in out and "waits e0<" in out
