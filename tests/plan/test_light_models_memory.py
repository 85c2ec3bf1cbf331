"""The nine onnx light models: in the default order the arena is at most 1.02 x the lower bound,
no two simultaneously live tensors overlap, ``tight`` never raises the lower bound, and no order
goes below the order floor (plan/order_bound.py; where the default order meets it, it is optimal).

Two loaders (see plan_light_models.py): the real one (import + registry inference; skipped while
an op lacks a kernel) and one on onnx's own shape hints that needs no kernel. Run with ``-s`` to
see the numbers.
"""
import pytest

from fusegraph.config import Config
from fusegraph.errors import UnsupportedOpError
from fusegraph.plan import plan_memory
from fusegraph.plan.memory import check_assignment
from plan_light_models import LIGHT_MODELS, load_inferred, load_with_hints

MB = 1e6


def _plans(graph):
    return {mode: plan_memory(graph, Config(memory=mode)) for mode in ("balanced", "tight")}


def _check_and_print(name, plans):
    bal, tight = plans["balanced"], plans["tight"]
    for p in (bal, tight):
        check_assignment(p.lifetimes.buffers, p.assignment.offsets, p.constraints)
        assert p.report.arena_bytes >= p.report.lower_bound_bytes
    r = bal.report
    assert r.order == "default"
    assert r.arena_bytes <= 1.02 * r.lower_bound_bytes, r.summary()
    assert tight.report.lower_bound_bytes <= r.lower_bound_bytes
    floor = r.order_floor_bytes
    assert floor is not None and floor == tight.report.order_floor_bytes
    assert floor <= tight.report.lower_bound_bytes  # no order beats the floor
    if r.lower_bound_bytes == floor:  # the default order is proven optimal: tight keeps it
        assert tight.report.order == "default"
    print(f"\n{name:14s} default: arena {r.arena_bytes / MB:.3f} MB, lower bound {r.lower_bound_bytes / MB:.3f} MB, "
          f"naive {r.naive_bytes / MB:.2f} MB (x{r.naive_over_arena:.1f}); tight ({tight.report.order}): "
          f"arena {tight.report.arena_bytes / MB:.3f} MB, lower bound {tight.report.lower_bound_bytes / MB:.3f} MB; "
          f"order floor {floor / MB:.3f} MB (at {r.order_floor_node})")


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_plan_after_inference(name):
    try:
        graph = load_inferred(name)
    except UnsupportedOpError as exc:
        pytest.skip(f"kernel missing: {exc}")
    _check_and_print(name, _plans(graph))


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_plan_on_onnx_shape_hints(name):
    graph = load_with_hints(name)
    _check_and_print(name, _plans(graph))
