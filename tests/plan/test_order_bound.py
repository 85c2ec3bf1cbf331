"""The order floor (plan/order_bound.py): never above the lower bound of any topological order
(brute force over every order of small random DAGs, with views, in-place, pinned outputs and
exclusive tensors), exact on a chain, and ``None`` where it cannot be computed."""
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fusegraph.ir import Graph
from fusegraph.plan.lifetime import LifetimeOptions, compute_lifetimes
from fusegraph.plan.order import check_order
from fusegraph.plan.order_bound import order_floor
from plan_graphs import branchy, chain, random_dag, typed_dag


def _orders(g):
    for perm in itertools.permutations(list(g.nodes)):
        try:
            check_order(g, list(perm))
        except ValueError:
            continue
        yield list(perm)


def _best(g, options):
    return min(compute_lifetimes(g, o, options).lower_bound_bytes for o in _orders(g))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 100_000), st.booleans())
def test_floor_never_exceeds_the_best_order(seed, inplace):
    g = typed_dag(seed)
    options = LifetimeOptions(inplace=inplace)
    assert order_floor(g, options).bytes <= _best(g, options)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 100_000))
def test_floor_with_exclusive_and_external_tensors(seed):
    g = random_dag(seed, 7)
    names = [n.outputs[0].name for n in g.nodes]
    rng = random.Random(seed)
    options = LifetimeOptions(inplace=False, exclusive_tensors=(rng.choice(names),),
                              external_tensors=(rng.choice(names),))
    assert order_floor(g, options).bytes <= _best(g, options)


def test_floor_is_exact_on_a_chain_and_names_the_forcing_node():
    g = chain(6)
    options = LifetimeOptions(inplace=False)
    floor = order_floor(g, options)
    assert floor.bytes == compute_lifetimes(g, None, options).lower_bound_bytes == 2 * 8 * 4 * 4 * 4
    assert floor.node in {n.name for n in g.nodes} and len(floor.live) == 2


def test_floor_sees_what_a_branchy_graph_must_hold():
    """Each expansion's output must live while its own reduction runs: one big + one small."""
    g = branchy(width=4)
    big, small = 64 * 8 * 8 * 4, 4 * 8 * 8 * 4
    floor = order_floor(g, LifetimeOptions(inplace=False)).bytes
    assert big + small <= floor <= _best_dfs(g)
    assert floor < compute_lifetimes(g, None, LifetimeOptions(inplace=False)).lower_bound_bytes


def _best_dfs(g):
    from fusegraph.plan.order import candidate_orders
    options = LifetimeOptions(inplace=False)
    return min(compute_lifetimes(g, o, options).lower_bound_bytes for o in candidate_orders(g).values())


def test_floor_is_unknown_with_step_based_constraints():
    g = chain(4)
    name = g.nodes[1].outputs[0].name
    assert order_floor(g, LifetimeOptions(tensor_lifetimes=((name, 0, 3),))) is None
    assert order_floor(g, LifetimeOptions(release_after=lambda v, last: last)) is None
    assert order_floor(Graph("empty"), LifetimeOptions()).bytes == 0
