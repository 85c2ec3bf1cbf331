"""The .fgm artifact's stored plan and prepacked weights: the loaded model binds the compiled
model's plan (arena, strides, streams) and oneDNN blocked weights without a probe run or a
reorder; a stored plan or descriptor that could crash, hang or race is refused. Prepacked
weights belong to the ideep convolution kernels (the oneDNN Graph kernels pack their own when
they compile), so the tests of stored blocked weights run with those kernels (``ideep``).
Shared helpers and the ``saved`` fixture come from ``test_artifact.py``.
"""
from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph import artifact as A
from fusegraph.errors import ArtifactError
from fusegraph.runtime.backends.cpu import onednn_graph, prepack
from test_artifact import FEEDS, _f32, _model, _same, json_part_edit, refused, reseal
from test_artifact import saved  # noqa: F401 - a fixture


def _views(model):
    """Each call's arena views as (offset in the arena, shape, strides), in plan order."""
    b = model._executor.binding
    return [None if c.out is None else [(v.data_ptr() - b.arena.lo, tuple(v.shape), v.stride()) for v in c.out]
            for c in b.calls]


def test_light_model_round_trip(tmp_path, monkeypatch):
    """The loaded model binds the compiled model's plan: same arena, same views with the
    strides the compile's probe found, and no probe run of its own."""
    import onnx
    from fusegraph import zoo
    from fusegraph.runtime import bind as bind_module
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path("squeezenet")), seed=0)
    model = fg.compile(proto)
    model.save(tmp_path / "m.fgm")
    feeds = zoo.random_feeds(proto)
    monkeypatch.setattr(bind_module, "probe_strides", lambda *a: pytest.fail("load ran the layout probe"))
    if prepack.AVAILABLE:   # the convolutions take the stored oneDNN blocked weights: no reorder
        prepack._reference_md()     # (but for the one tiny weight packed once per process)
        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_convolution_weight",
                            lambda *a: pytest.fail("load reordered a convolution weight"))
    loaded = fg.load(tmp_path / "m.fgm")
    _same(model.run(feeds), loaded.run(feeds))
    assert loaded.plan.to_dict() == model.plan.to_dict()
    b0, b1 = model._executor.binding, loaded._executor.binding
    assert b1.arena.nbytes == b0.arena.nbytes and b1.strides == b0.strides and b0.strides
    assert _views(loaded) == _views(model)


@pytest.fixture
def ideep(monkeypatch):
    """Convolutions through the ideep kernels, whose weights the artifact stores prepacked."""
    monkeypatch.setattr(onednn_graph, "AVAILABLE", False)


@pytest.fixture(scope="module")
def conv_saved(tmp_path_factory):
    if not prepack.AVAILABLE:
        pytest.skip("this torch cannot rebuild oneDNN tensors from bytes")
    import onnx
    from fusegraph import zoo
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path("squeezenet")), seed=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onednn_graph, "AVAILABLE", False)
        model = fg.compile(proto)
    path = tmp_path_factory.mktemp("fgm3") / "conv.fgm"
    model.save(path)
    header, parts = A.unpack(path)
    n = int.from_bytes(parts["weights"][:8], "little")
    head = json.loads(parts["weights"][8:8 + n])
    forms = json.loads(head["__metadata__"]["fusegraph.prepacked"])
    assert forms and set(forms) <= set(model.graph.constants)
    return model, path, head, forms, zoo.random_feeds(proto)


def _poke_descriptor(head, forms, value_at):
    """Overwrite bytes of the first stored oneDNN descriptor (inside the weights data section)."""
    def parts_fn(parts):
        n = int.from_bytes(parts["weights"][:8], "little")
        lo, _ = head[next(iter(forms.values()))[0]["md"]]["data_offsets"]
        w = bytearray(parts["weights"])
        for pos, byte in value_at:
            w[8 + n + lo + pos] = byte
        parts["weights"] = bytes(w)
    return parts_fn


@pytest.mark.parametrize("value_at", [[(4, 9)], [(8, 65)], [(334, 1)], [(416, 7)], [(700, 1)]],
                         ids=["ndims", "dims", "strides", "blocks", "tail"])
def test_tampered_prepacked_descriptor(conv_saved, ideep, tmp_path, value_at):
    """A resealed file whose oneDNN descriptor lies is refused before oneDNN reads it."""
    _, path, head, forms, _ = conv_saved
    refused(reseal(path, tmp_path / "d.fgm", parts_fn=_poke_descriptor(head, forms, value_at)),
            "does not match its descriptor")


def test_prepacked_forms_only_for_the_same_build(conv_saved, ideep, tmp_path, monkeypatch):
    """Another torch build (or thread count) reorders the plain weights instead: same bits."""
    model, path, _, _, feeds = conv_saved
    used = []
    real = prepack.rebuild
    monkeypatch.setattr(prepack, "rebuild", lambda *a: used.append(1) or real(*a))
    _same(model.run(feeds), fg.load(path).run(feeds))
    assert used
    used.clear()
    other = reseal(path, tmp_path / "o.fgm", lambda h: h.update(torch_version="0.0.1"))
    _same(model.run(feeds), fg.load(other).run(feeds))
    assert not used
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        _same(model.run(feeds), fg.load(path).run(feeds))
    finally:
        torch.set_num_threads(threads)
    assert not used


def two_stream_model():
    """Two independent conv branches that meet: the stream planner puts them on two streams."""
    w = [numpy_helper.from_array(_f32(32, 16, 3, 3) * 0.2, f"w{i}") for i in (1, 2)]
    return _model([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["a"], ["ar"]),
                   helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
                   helper.make_node("Sigmoid", ["b"], ["bs"]), helper.make_node("Add", ["ar", "bs"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])], w)


@pytest.fixture(scope="module")
def two_streams(tmp_path_factory):
    model = fg.compile(two_stream_model(), fg.Config(streams=2))
    if model.plan.streams is None or model.plan.streams.num_streams < 2:
        pytest.skip("the stream planner kept one stream")
    path = tmp_path_factory.mktemp("fgm2") / "two.fgm"
    model.save(path)
    return model, path


def test_stream_plan_round_trip(two_streams):
    model, path = two_streams
    loaded = fg.load(path)
    assert loaded.plan.streams.to_dict() == model.plan.streams.to_dict()
    feeds = {"x": _f32(1, 16, 32, 32)}
    _same(model.run(feeds), loaded.run(feeds))


def _plan_edit(fn):
    return json_part_edit("report", fn)


def _deadlock(r):
    """The meeting node records an event that the first node of the other stream waits on."""
    sp = r["plan"]["streams"]
    last = r["plan"]["order"][-1]
    other = next(lst[0] for k, lst in enumerate(sp["per_stream"]) if k != sp["stream_of"][last])
    sp["events"].append({"id": 99, "producer": last, "stream": sp["stream_of"][last]})
    sp["records"][last] = 99
    sp["waits"][other] = sp["waits"].get(other, []) + [99]


@pytest.mark.parametrize("fn, words", [
    (lambda r: r["plan"]["streams"].update(waits={}), ["race"]),
    (_deadlock, ["deadlock"]),
    (lambda r: r["plan"]["streams"].update(num_streams=1 << 20), ["stream count"]),
    (lambda r: r["plan"]["streams"]["per_stream"].reverse(), ["per-stream"]),
])
def test_hostile_stream_plan(two_streams, tmp_path, fn, words):
    refused(reseal(two_streams[1], tmp_path / "s.fgm", parts_fn=_plan_edit(fn)), *words)


@pytest.mark.parametrize("fn, words", [
    (lambda r: r["plan"]["order"].reverse(), ["before the producer"]),
    (lambda r: r["plan"]["order"].pop(), ["each of the graph's nodes once"]),
    (lambda r: r["plan"].update(memory_mode="roomy"), ["memory mode"]),
    (lambda r: r["plan"].update(arena_bytes=1 << 50), ["larger than all its slots"]),
    (lambda r: r["plan"]["slots"].update(d=[r["plan"]["arena_bytes"], 96]), ["does not hold"]),
    (lambda r: r["plan"]["slots"].update(d=[0, 8]), ["does not hold"]),
    (lambda r: r["plan"]["slots"].update(ghost=[0, 8]), ["unknown value"]),
    (lambda r: r.update(strides={"d": [1, 1, 1]}), ["dense layout"]),
    (lambda r: r.update(strides={"x": [12, 4, 1]}), ["dense layout"]),
    (lambda r: r.update(plan=[1]), ["plan"]),
    (lambda r: r["plan"].pop("order"), ["plan is malformed"]),
])
def test_hostile_plan(saved, tmp_path, fn, words):
    refused(reseal(saved["diamond"][1], tmp_path / "p.fgm", parts_fn=_plan_edit(fn)), *words)


def test_plan_without_arena_still_runs(saved, tmp_path):
    """A file whose plan was dropped loads as memory "off" (every tensor its own allocation)."""
    path = reseal(saved["diamond"][1], tmp_path / "n.fgm", parts_fn=_plan_edit(lambda r: r.update(plan=None)))
    feeds = FEEDS["diamond"]()
    loaded = fg.load(path)
    assert loaded.plan is None
    _same(saved["diamond"][0].run(feeds), loaded.run(feeds))


@settings(max_examples=int(os.environ.get("FG_FUZZ_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 771), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_prepacked_descriptor(conv_saved, ideep, tmp_path, edits):
    """Resealed byte edits of a stored oneDNN descriptor: refused, or a run that does not crash
    (only a descriptor whose every access stays inside its bytes reaches oneDNN)."""
    _, path, head, forms, feeds = conv_saved
    try:
        loaded = fg.load(reseal(path, tmp_path / "f.fgm", parts_fn=_poke_descriptor(head, forms, edits)))
    except ArtifactError:
        return
    loaded.run(feeds)


def _squeezenet(streams: int):
    import onnx
    from fusegraph import zoo
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path("squeezenet")), seed=0)
    return proto, fg.compile(proto, fg.Config(streams=streams))


@pytest.mark.parametrize("streams", [1, 2])
def test_overlapping_arena_slots_are_refused(tmp_path, streams):
    """A plan re-sealed with one slot moved onto bytes another live value holds is refused
    naming both values; the untouched plan (with streams, in-place tenants) loads."""
    from fusegraph import zoo
    proto, model = _squeezenet(streams)
    path = tmp_path / "m.fgm"
    model.save(path)
    feeds = zoo.random_feeds(proto)
    _same(model.run(feeds), fg.load(path).run(feeds))
    slots = model.plan.slots
    # move the value with the biggest slot to offset 0 and to its neighbour's offset
    big = max(slots, key=lambda k: slots[k][1])
    refusals = 0
    for target in sorted({off for off, _ in slots.values()})[:6]:
        if target == slots[big][0]:
            continue
        edit = _plan_edit(lambda r, t=target: r["plan"]["slots"].update({big: [t, slots[big][1]]}))
        bad = reseal(path, tmp_path / f"o{target}.fgm", parts_fn=edit)
        try:
            loaded = fg.load(bad)
        except ArtifactError as exc:
            assert "overlapping arena bytes" in str(exc) and repr(big) in str(exc)
            refusals += 1
            continue
        _same(model.run(feeds), loaded.run(feeds))   # a move onto bytes free meanwhile is fine
    assert refusals


def test_slot_shifted_by_64_bytes_is_refused(saved, tmp_path):
    """The issue's case: shifting one slot by 64 bytes used to load and compute wrong numbers."""
    model, path = saved["diamond"][:2]
    slots = model.plan.slots
    moved = 0
    for name, (off, size) in slots.items():
        others = [(o, s) for n, (o, s) in slots.items() if n != name]
        if off + 64 + size <= model.plan.arena_bytes and any(o < off + 64 + size and off + 64 < o + s
                                                             for o, s in others):
            edit = _plan_edit(lambda r, n=name, o=off, s=size: r["plan"]["slots"].update({n: [o + 64, s]}))
            try:
                loaded = fg.load(reseal(path, tmp_path / "s.fgm", parts_fn=edit))
            except ArtifactError as exc:
                assert "overlapping" in str(exc) or "does not hold" in str(exc)
                moved += 1
                continue
            feeds = FEEDS["diamond"]()
            _same(model.run(feeds), loaded.run(feeds))
    assert moved
