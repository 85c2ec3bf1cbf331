"""Exhaustive ordering by segments (plan/exhaustive.py): when every segment was enumerated, its
order's lower bound (views and in-place included) is the best over all topological orders
(brute force on small random DAGs); past its limits it says so and stays topological."""
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from fusegraph.plan.exhaustive import exhaustive_order
from fusegraph.plan.lifetime import LifetimeOptions, compute_lifetimes
from fusegraph.plan.memory import live_bytes
from fusegraph.plan.order import check_order
from fusegraph.plan.order_model import OrderModel
from plan_graphs import branchy, typed_dag


def _fns(g, options):
    def live(order):
        lt = compute_lifetimes(g, order, options)
        return live_bytes(lt.buffers, lt.constraints())
    return live, lambda order: compute_lifetimes(g, order, options).lower_bound_bytes


def _brute_force(g, score):
    best = None
    for perm in itertools.permutations(list(g.nodes)):
        try:
            check_order(g, list(perm))
        except ValueError:
            continue
        s = score(list(perm))
        best = s if best is None else min(best, s)
    return best


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.booleans())
def test_exhaustive_matches_brute_force(seed, inplace):
    g = typed_dag(seed, 7)
    live, score = _fns(g, LifetimeOptions(inplace=inplace))
    order, exact = exhaustive_order(OrderModel(g), live, per_segment=5040, work=10**7)
    check_order(g, order)
    assert exact
    assert score(order) == _brute_force(g, score)


def test_exhaustive_keeps_big_segments_and_says_so():
    g = branchy(width=4)  # one segment of 8 nodes between stem and cat: 8!/2^4 = 2520 orders
    live, score = _fns(g, LifetimeOptions(inplace=False))
    order, exact = exhaustive_order(OrderModel(g), live, per_segment=100)
    check_order(g, order)
    assert not exact and order == list(g.nodes)
    order, exact = exhaustive_order(OrderModel(g), live, per_segment=3000, work=3000 * len(g.nodes))
    assert exact and score(order) < score(list(g.nodes))


def test_exhaustive_starts_unsearched_segments_from_the_base_order():
    g = branchy(width=4)
    live, score = _fns(g, LifetimeOptions(inplace=False))
    best, _ = exhaustive_order(OrderModel(g), live, per_segment=3000, work=3000 * len(g.nodes))
    order, exact = exhaustive_order(OrderModel(g), live, base=best, per_segment=10)
    assert not exact and order == best
