"""The runtime's arena: outputs are bit-identical with memory off / balanced / tight, kernels
write into their planned slices (same addresses on every run, inside the arena), results
that alias the arena untracked are copied, and report.memory carries the plan."""
import ast
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fusegraph as fg
from fusegraph.testing import zoo

F = TensorProto.FLOAT
MODES = ("off", "balanced", "tight")


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _small_models():
    r = _rng()
    x = _vi("x", [2, 8, 6, 6])
    m = {}
    m["chain"] = (_model([
        helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Mul", ["a", "x"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["c"]), helper.make_node("Add", ["c", "a"], ["d"]),
        helper.make_node("Tanh", ["d"], ["e"]), helper.make_node("Exp", ["e"], ["f"]),
        helper.make_node("Neg", ["f"], ["g"]), helper.make_node("Abs", ["g"], ["h"]),
        helper.make_node("Sqrt", ["h"], ["y"])], [x], [_vi("y", None)]), {"x": r.standard_normal((2, 8, 6, 6))})
    m["branches"] = (_model([
        helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
        helper.make_node("Mul", ["a", "b"], ["c"]), helper.make_node("Concat", ["a", "b", "c"], ["d"], axis=1),
        helper.make_node("Softmax", ["d"], ["e"], axis=1), helper.make_node("LeakyRelu", ["e"], ["f"], alpha=0.2),
        helper.make_node("Sum", ["f", "f", "f"], ["y"])], [x], [_vi("y", None)]),
        {"x": r.standard_normal((2, 8, 6, 6))})
    w = r.standard_normal((16, 32)).astype(np.float32)
    w2 = r.standard_normal((10, 32)).astype(np.float32)
    b = r.standard_normal((10,)).astype(np.float32)
    m["linear"] = (_model([
        helper.make_node("MatMul", ["v", "w"], ["a"]), helper.make_node("Relu", ["a"], ["a2"]),
        helper.make_node("Gemm", ["a2", "w2", "b"], ["c"], transB=1, alpha=0.5),
        helper.make_node("Gemm", ["a2", "w2"], ["c2"], transB=1),
        helper.make_node("Sum", ["c", "c2", "c"], ["s"]), helper.make_node("Max", ["s", "c2"], ["t"]),
        helper.make_node("Mean", ["t", "c", "s"], ["u"]),
        helper.make_node("LogSoftmax", ["u"], ["y"], axis=-1)],
        [_vi("v", [4, 16])], [_vi("y", None), _vi("s", None)], [_init("w", w), _init("w2", w2), _init("b", b)]),
        {"v": r.standard_normal((4, 16))})
    shape = _init("shape", np.array([2, 8, 36], np.int64))
    m["views"] = (_model([
        helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["b"]),
        helper.make_node("Transpose", ["b"], ["c"], perm=[0, 2, 1]), helper.make_node("Exp", ["c"], ["d"]),
        helper.make_node("Flatten", ["d"], ["e"], axis=1), helper.make_node("Cast", ["e"], ["f"], to=F),
        helper.make_node("Identity", ["f"], ["g"]), helper.make_node("Sin", ["g"], ["h"]),
        helper.make_node("Add", ["h", "e"], ["y"])], [x], [_vi("y", None), _vi("c", None)], [shape]),
        {"x": r.standard_normal((2, 8, 6, 6))})
    m["select"] = (_model([
        helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Less", ["a", "x"], ["lt"]),
        helper.make_node("Not", ["lt"], ["nl"]), helper.make_node("Where", ["nl", "a", "x"], ["w"]),
        helper.make_node("Clip", ["w", "lo", "hi"], ["cl"]), helper.make_node("Split", ["cl"], ["s1", "s2"], axis=1),
        helper.make_node("Div", ["s1", "s2"], ["q"]), helper.make_node("GlobalAveragePool", ["q"], ["y"])],
        [x], [_vi("y", None), _vi("nl", None, TensorProto.BOOL)], [_init("lo", np.float32(-0.5)), _init("hi", np.float32(0.7))]),
        {"x": r.standard_normal((2, 8, 6, 6))})
    for k, (model, feeds) in m.items():
        m[k] = (model, {n: a.astype(np.float32) for n, a in feeds.items()})
    return m


SMALL = _small_models()


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k], equal_nan=True), f"{k}: max diff {np.abs(a[k] - b[k]).max()}"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_graphs_identical_in_every_memory_mode(name):
    model, feeds = SMALL[name]
    out = {mode: fg.compile(model, fg.Config(memory=mode)).run(feeds) for mode in MODES}
    _equal(out["off"], out["balanced"])
    _equal(out["off"], out["tight"])


@pytest.mark.parametrize("name", sorted(SMALL))
def test_out_kernels_write_into_their_slots_and_allocate_nothing_per_run(name):
    model, feeds = SMALL[name]
    c = fg.compile(model, fg.Config(memory="balanced"))
    ex = c._executor
    arena = ex.arena
    assert arena is not None and arena.nbytes == c.report.memory.arena_bytes
    calls = ex.binding.calls
    writing = {call.index: call for call in calls if call.out is not None}
    assert writing, "some kernel must write into the arena"
    seen: list[dict] = []

    def hook(i, phase, outs):
        if phase == 1 and i in writing:
            seen[-1][i] = [t.data_ptr() for t in outs]

    for _ in range(2):
        seen.append({})
        c.run(feeds, hook=hook)
    assert seen[0] == seen[1], "a planned tensor moved between runs"
    for i, ptrs in seen[0].items():
        assert ptrs == [v.data_ptr() for v in writing[i].out]
        assert all(arena.lo <= p < arena.hi or v.numel() == 0 for p, v in zip(ptrs, writing[i].out))
    # the hooked code writes where the plain one does
    got = c.run(feeds)
    _equal(got, fg.compile(model, fg.Config(memory="off")).run(feeds))


def test_outputs_handed_out_are_copies_not_the_arena():
    model, feeds = SMALL["chain"]
    c = fg.compile(model, fg.Config(memory="balanced"))
    first = c.run(feeds)["y"]
    keep = first.copy()
    c.run({"x": feeds["x"] * 3})
    np.testing.assert_array_equal(first, keep)


def test_untracked_alias_is_copied_out_of_the_arena():
    # Cast to the same dtype returns its input: the guard must copy it before the slot is reused
    model, feeds = SMALL["views"]
    c = fg.compile(model, fg.Config(memory="balanced"))
    assert "if _AL <= " in c.source or not any(call.guard for call in c._executor.binding.calls)
    _equal(c.run(feeds), fg.compile(model, fg.Config(memory="off")).run(feeds))


def test_memory_off_has_no_arena():
    model, feeds = SMALL["chain"]
    c = fg.compile(model, fg.Config(memory="off"))
    assert c._executor.arena is None and "out=" not in c.source
    assert c.report.memory.mode == "off" and c.report.memory.not_writable_into_arena == []


def test_report_fields():
    model, _ = SMALL["branches"]
    c = fg.compile(model, fg.Config(memory="balanced"))
    mem = c.report.memory
    assert mem.arena_bytes >= mem.lower_bound_bytes > 0 and mem.naive_bytes >= mem.lower_bound_bytes
    assert mem.tensors and all(hasattr(t, k) for t in mem.tensors for k in ("offset", "size", "first", "last"))
    assert isinstance(mem.unplannable, list) and isinstance(mem.not_writable_into_arena, list)
    for entry in mem.not_writable_into_arena:
        assert set(entry) == {"node", "op", "bytes"} and entry["bytes"] > 0
    json.dumps(c.report.to_dict())
    json.dumps(c.plan.to_dict())


def test_tight_generates_code_in_the_planned_order():
    model, feeds = SMALL["branches"]
    c = fg.compile(model, fg.Config(memory="tight"))   # one line per node
    lines = [ln for ln in c.source.splitlines() if "  # " in ln]
    assert [ast.literal_eval(ln.rsplit(" ", 1)[-1]) for ln in lines] == c.plan.order


def test_out_form_matches_plain_kernels_on_nan_and_signed_zero():
    x = np.array([[np.nan, -0.0, 0.0, -1.0, 2.0, np.inf, -np.inf, 3.5]], np.float32)
    ops = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Floor", "Ceil", "Round", "Sign"]
    model = _model([helper.make_node(op, ["x"], [f"y{i}"]) for i, op in enumerate(ops)] +
                   [helper.make_node("Add", [f"y{i}", "x"], [f"z{i}"]) for i in range(len(ops))],
                   [_vi("x", [1, 8])], [_vi(f"z{i}", None) for i in range(len(ops))])
    out = {mode: fg.compile(model, fg.Config(memory=mode)).run({"x": x}) for mode in ("off", "balanced")}
    for k in out["off"]:
        a, b = out["off"][k], out["balanced"][k]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), k   # bits, signed zeros included


# ------------------------------------------------------------------ light models

LIGHT = ("squeezenet", "inception_v1", "shufflenet", "resnet50")


@pytest.fixture(scope="module", params=LIGHT)
def light(request):
    proto = zoo.expose_logits(zoo.random_light_model(request.param, calibrate=False))
    return request.param, proto, zoo.random_feeds(proto, seed=1)


def test_light_models_identical_in_every_memory_mode(light):
    from stream_plans import rebind
    name, proto, feeds = light
    base = fg.compile(proto, fg.Config(memory="off"))
    want = base.run(feeds)
    strides = {}
    names = base.plan.order
    base.run(feeds, hook=lambda i, phase, outs: phase and strides.__setitem__(names[i], [t.stride() for t in outs]))
    for mode in ("balanced", "tight"):
        model = rebind(base, mode)
        mem = model.report.memory
        assert mem.arena_bytes >= mem.lower_bound_bytes, name
        writing = [c for c in model._executor.binding.calls if c.out is not None]
        assert writing, name
        # arena views are laid out as the kernels lay out their own results (channels-last ...)
        same = sum(strides[c.node.name] == [v.stride() for v in c.out] for c in writing)
        assert same >= 0.9 * len(writing), f"{name}: {len(writing) - same} arena views with another layout"
        for _ in range(2):
            _equal(want, model.run(feeds))


@pytest.mark.parametrize("streams", [1, 2])
def test_execution_plan_round_trips_through_json(streams):
    from fusegraph.compiler.driver import CompiledModel
    from fusegraph.plan.exec_plan import ExecutionPlan
    model, feeds = SMALL["branches"]
    c = fg.compile(model, fg.Config(memory="tight", streams=streams))
    plan = ExecutionPlan.from_dict(json.loads(json.dumps(c.plan.to_dict())))
    assert plan.to_dict() == c.plan.to_dict()
    again = CompiledModel.from_optimized(c.graph, c.config, fg.report.CompileReport(), plan)
    assert again.source == c.source
    _equal(c.run(feeds), again.run(feeds))
    again.close()
    c.close()


@pytest.mark.parametrize("dims", [(2, 12), ("n", 12)])
def test_a_split_writes_its_parts_into_their_slots(dims):
    """A Split of an activation in the arena writes its parts into their own planned bytes
    (``out=``), static or symbolic: no part is a view of the input's slot that the run would
    have to copy out before the slot is reused; the outputs are onnxruntime's."""
    from oracle import assert_outputs_close, ort_run
    rng = _rng(4)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r", "sizes"], ["a", "b", "c"], axis=1),
             helper.make_node("Mul", ["a", "b"], ["ab"]),
             helper.make_node("Sigmoid", ["c"], ["cs"]),
             helper.make_node("Concat", ["ab", "cs", "a"], ["y"], axis=1)]
    model = _model(nodes, [_vi("x", list(dims))], [_vi("y", None)],
                   [_init("sizes", np.array([4, 4, 4], np.int64))])
    c = fg.compile(model, fg.Config(memory="balanced"))
    split_line = next(line for line in c.source.splitlines() if "'Split'" in line)
    assert "out=" in split_line, split_line
    parts = split_line.split("out=")[1].split(")")[0].strip("(").replace(" ", "").strip(",").split(",")
    copied = [line.split("if _AL <= ")[1].split(".")[0] for line in c.source.splitlines() if "if _AL <= " in line]
    assert len(parts) == 3 and not set(parts) & set(copied), (parts, copied)
    for rows in (2, 5) if isinstance(dims[0], str) else (2,):
        feeds = {"x": rng.standard_normal((rows, 12)).astype(np.float32)}
        assert_outputs_close(c.run(feeds), ort_run(model, feeds))
