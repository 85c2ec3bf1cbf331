"""The multi-stream CPU executor: outputs identical to one stream on the light models but the
large chains vgg19 and zfnet512 (bvlc_alexnet is one; 10 repetitions each), every consumer
starts after its producers finish on random DAGs with random stream counts (recorded
timestamps), buffers that share arena bytes are never in use at the same time, failures
surface as KernelError without hanging, and the thread budget is restored. Hybrid plans
(``streams="auto"`` on CPU): wide nodes run with every thread and nothing beside them, narrow
nodes on one thread, results equal to one stream; the calibrated ``auto`` on inception_v1
matches the O0 graph and repeats bit-identically.

Bit-identity is compared at one intra-op thread per kernel: oneDNN splits a convolution's
reduction by thread count, so 2 threads and 1 thread differ in the last bits, whatever the
streams (and one thread per kernel keeps these runs quick on a loaded 2-core machine). Light
models use
``plan/streams.py`` (the toy planner of ``stream_plans.py`` when it is absent); random DAGs use the toy planner (random assignments, unpruned events).
"""
import importlib.util
import random
import threading
import time

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.errors import KernelError
from stream_plans import rebind

HAVE_PLANNER = importlib.util.find_spec("fusegraph.plan.streams") is not None
REPS = 10


def _equal(a: dict, b: dict, what="") -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), f"{what} {k}: max diff {np.abs(a[k] - b[k]).max()}"


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


@pytest.fixture(scope="module", params=zoo.LIGHT_MODELS_BUT_LARGE_CHAINS)   # a chain: bvlc_alexnet
def light(request):
    proto = zoo.expose_logits(zoo.random_light_model(request.param, calibrate=False))
    feeds = zoo.random_feeds(proto, seed=1)
    base = fg.compile(proto, fg.Config(memory="off"))
    with _threads(1):
        want = base.run(feeds)
    return request.param, base, feeds, want, rebind(base, "balanced", 1)


@pytest.mark.parametrize("streams", [1, 2, 4])
def test_light_models_identical_for_1_2_4_streams(light, streams):
    """10 runs per stream count, one intra-op thread per stream, against a one-thread reference.
    A model the planner keeps on one stream is the one-stream model (same generated code): it is
    checked once."""
    name, base, feeds, want, single = light
    model = single if streams == 1 else rebind(base, "balanced", streams, seed=streams,
                                               planner="real" if HAVE_PLANNER else "toy")
    used = model.plan.streams.num_streams if model.plan.streams is not None else 1
    reps = REPS if streams == 1 or used > 1 else 1
    if used == 1 and streams > 1:
        assert model.source == single.source
    with _threads(used):
        for _ in range(reps):
            _equal(want, model.run(feeds), f"{name} streams={streams} (planned {used})")
    model.close()


# ------------------------------------------------------------------ random DAGs

def _random_dag(seed: int):
    rng = random.Random(seed)
    n_nodes = rng.randint(6, 30)
    w = np.random.default_rng(seed).standard_normal((48, 48)).astype(np.float32) / 7
    vals, nodes = ["x", "y"], []
    for i in range(n_nodes):
        kind = rng.random()
        out = f"t{i}"
        if kind < 0.3:
            op = rng.choice(["Relu", "Sigmoid", "Tanh", "Neg", "Abs"])
            nodes.append(helper.make_node(op, [rng.choice(vals)], [out]))
        elif kind < 0.6:
            nodes.append(helper.make_node(rng.choice(["Add", "Mul", "Sub", "Max"]), rng.sample(vals, 2) if len(vals) > 1
                                          else vals * 2, [out]))
        elif kind < 0.8:
            nodes.append(helper.make_node("MatMul", [rng.choice(vals), "w"], [out]))
        else:
            nodes.append(helper.make_node("Sum", [rng.choice(vals) for _ in range(3)], [out]))
        vals.append(out)
    used = {i for n in nodes for i in n.input}
    outs = [v for v in vals[2:] if v not in used] or [vals[-1]]
    g = helper.make_graph(nodes, f"dag{seed}", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [8, 48])
                                                 for n in ("x", "y")],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                          initializer=[onnx.numpy_helper.from_array(w, "w")])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {n: np.random.default_rng(seed + k).standard_normal((8, 48)).astype(np.float32)
             for k, n in enumerate(("x", "y"))}
    return proto, feeds


@pytest.mark.parametrize("seed", range(25))
def test_random_dags_respect_dependencies_and_match_sequential(seed):
    proto, feeds = _random_dag(seed)
    base = fg.compile(proto, fg.Config(memory="off", level="O0"))
    with _threads(1):
        want = base.run(feeds)
    n = random.Random(seed).randint(1, 5)
    memory = ("off", "balanced", "tight")[seed % 3]
    model = rebind(base, memory, n, seed=seed)
    order = model.plan.order
    by_name = {nd.name: nd for nd in model.graph.nodes}
    for _ in range(3):
        stamps: dict[int, list] = {}

        def hook(i, phase, outs):
            stamps.setdefault(i, [0, 0, None])[phase] = time.perf_counter_ns()
            stamps[i][2] = threading.current_thread().name

        with _threads(n):
            got = model.run(feeds, hook=hook)
        _equal(want, got, f"seed {seed}")
        assert len(stamps) == len(order)
        pos = {name: i for i, name in enumerate(order)}
        for i, name in enumerate(order):
            for v in by_name[name].inputs:
                if v is not None and v.producer is not None:
                    p = pos[v.producer.name]
                    assert stamps[i][0] >= stamps[p][1], \
                        f"{name} started before its producer {v.producer.name} finished"
        _check_shared_bytes_not_used_at_once(model, by_name, pos, stamps)
    if n > 1:
        assert len({s[2] for s in stamps.values()}) > 1 or model.plan.streams.num_streams == 1 or \
            sum(1 for s in model.plan.streams.per_stream if s) == 1
    model.close()


def _check_shared_bytes_not_used_at_once(model, by_name, pos, stamps):
    """Buffers whose arena bytes overlap are live at disjoint real times."""
    plan = model.plan
    if not plan.uses_arena:
        return
    mem = model.report.memory
    spans = []
    for b in mem.buffers:
        touch = []
        for name in b["members"]:
            v = next((o for nd in by_name.values() for o in nd.outputs if o.name == name), None)
            if v is None:
                continue
            touch += [pos[u.name] for u in v.users] + ([pos[v.producer.name]] if v.producer is not None else [])
        if touch:
            t0 = min(stamps[i][0] for i in touch)
            t1 = max(stamps[i][1] for i in touch)
            spans.append((b["offset"], b["offset"] + b["size"], t0, t1, b["name"]))
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a[0] < b[1] and b[0] < a[1] and a[1] > a[0] and b[1] > b[0]:
                assert a[3] < b[2] or b[3] < a[2], f"{a[4]} and {b[4]} share bytes while both in use"


# ------------------------------------------------------------------ failures and threads

def _reshape_model():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
             helper.make_node("Reshape", ["b", "s"], ["c"]), helper.make_node("Tanh", ["a"], ["d"]),
             helper.make_node("Exp", ["d"], ["e"])]
    g = helper.make_graph(nodes, "fail", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
                                          helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("c", "e")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("seed", range(4))
def test_a_failing_stream_raises_kernel_error_and_the_model_still_runs(seed):
    base = fg.compile(_reshape_model(), fg.Config(memory="off", level="O0"))
    model = rebind(base, "balanced", 3, seed=seed)
    x = np.ones((4, 6), np.float32)
    with pytest.raises(KernelError, match="Reshape"):
        model.run({"x": x, "s": np.array([5, 5], np.int64)})
    good = model.run({"x": x, "s": np.array([6, 4], np.int64)})
    _equal(good, base.run({"x": x, "s": np.array([6, 4], np.int64)}))
    model.close()


def test_thread_budget_is_split_and_restored():
    proto, feeds = _random_dag(3)
    base = fg.compile(proto, fg.Config(memory="off", level="O0"))
    model = rebind(base, "balanced", 2, seed=1)
    seen = {}

    def hook(i, phase, outs):
        seen[threading.current_thread().name] = torch.get_num_threads()

    with _threads(2):
        model.run(feeds, hook=hook)
        assert torch.get_num_threads() == 2
    assert set(seen.values()) == {1}
    model.close()


def _hybrid_model(seed: int, memory: str = "balanced"):
    """A random DAG compiled with streams="auto" and fabricated calibration costs under which
    the planner makes a hybrid plan: a few nodes wide (alone, both threads), the rest on two
    one-thread streams."""
    from fusegraph.compiler.planning import plan_execution
    from fusegraph.plan.cost import CostModel, MeasuredCosts
    from fusegraph.runtime import stream_calibrate
    proto, feeds = _random_dag(seed)
    base = fg.compile(proto, fg.Config(memory="off", level="O0"))
    rng = random.Random(seed)
    names = [n.name for n in base.graph.nodes]
    one = {n: rng.uniform(50, 400) for n in names}
    two = {n: one[n] * (0.5 if rng.random() < 0.3 else 0.97) for n in names}
    flat = CostModel(device="cpu", cores=2, threads=2, efficiency=0.0)     # no cap on the 2-thread times
    fake = MeasuredCosts({1: one, 2: two}, cores=2, sync_us=1.0, contention=1.0, fallback=flat)
    original = stream_calibrate.calibrate_costs
    stream_calibrate.calibrate_costs = lambda *a, **k: fake
    try:
        config = base.config.replace(memory=memory, threads=2, streams="auto")
        report = fg.report.CompileReport(model=base.name)
        model = fg.compiler.CompiledModel(base.graph, config, report, plan_execution(base.graph, config, report))
    finally:
        stream_calibrate.calibrate_costs = original
    return base, model, feeds


@pytest.mark.parametrize("seed", range(12))
def test_hybrid_plans_run_wide_nodes_alone_with_every_thread(seed):
    """Wide nodes see both threads and nothing runs beside them (recorded timestamps); narrow
    nodes see one thread; outputs equal the one-stream run; the caller's setting is restored."""
    base, model, feeds = _hybrid_model(seed, ("off", "balanced", "tight")[seed % 3])
    with _threads(1):
        want = base.run(feeds)
    sp = model.plan.streams
    assert sp is not None and sp.num_streams == 2
    order = model.plan.order
    wide = {order.index(n) for n in sp.wide}
    for _ in range(3):
        stamps: dict[int, list] = {}

        def hook(i, phase, outs):
            stamps.setdefault(i, [0, 0, 0])[phase] = time.perf_counter_ns()
            stamps[i][2] = torch.get_num_threads()

        with _threads(2):
            got = model.run(feeds, hook=hook)
            assert torch.get_num_threads() == 2
        _equal(want, got, f"seed {seed}")
        for i, (t0, t1, threads) in stamps.items():
            assert threads == (2 if i in wide else 1), f"{order[i]} ran with {threads} threads"
        for w in wide:
            for i, (t0, t1, _) in stamps.items():
                if i != w:
                    assert t1 <= stamps[w][0] or t0 >= stamps[w][1], f"{order[i]} ran beside wide {order[w]}"
    assert any(i not in wide for i in stamps)
    model.close()


def test_hybrid_plans_are_made():
    """The fabricated costs above do give hybrid plans (wide and narrow nodes) for some DAGs."""
    hybrid = 0
    for seed in range(12):
        _, model, _ = _hybrid_model(seed)
        hybrid += bool(model.plan.streams.wide)
        model.close()
    assert hybrid >= 2


def test_auto_calibrated_branchy_model_matches_the_unoptimised_graph():
    """streams="auto" with the timed calibration on inception_v1: whatever plan it makes,
    outputs match the O0 graph (rtol 1e-4) and are bit-identical over 10 runs."""
    proto = zoo.expose_logits(zoo.random_light_model("inception_v1", calibrate=False))
    feeds = zoo.random_feeds(proto, seed=1)
    with _threads(2):
        oracle = fg.compile(proto, fg.Config(level="O0", memory="off")).run(feeds)
        model = fg.compile(proto, fg.Config(streams="auto", threads=2))
        sp = model.plan.streams
        assert sp is None or set(sp.wide) <= set(sp.stream_of)
        first = model.run(feeds)
        for k in oracle:
            np.testing.assert_allclose(first[k], oracle[k], rtol=1e-4, atol=1e-5)
        for _ in range(REPS - 1):
            _equal(first, model.run(feeds), "auto run-to-run")
    model.close()


def test_workers_are_persistent_and_stop_on_close():
    proto, feeds = _random_dag(5)
    model = rebind(fg.compile(proto, fg.Config(memory="off", level="O0")), "balanced", 3, seed=2)
    model.run(feeds)
    workers = list(model._executor._runner._workers)
    model.run(feeds)
    assert workers and model._executor._runner._workers == workers
    model.close()
    for w in workers:
        w.thread.join(timeout=5)
        assert not w.thread.is_alive()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("streams", [1, 2, 4])
def test_cuda_streams_match_cpu(streams):
    proto, feeds = _random_dag(7)
    want = fg.compile(proto, fg.Config(memory="off")).run(feeds)
    base = fg.compile(proto, fg.Config(memory="off", device="cuda"))
    model = rebind(base, "balanced", streams, seed=3)
    for _ in range(3):
        got = model.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
