"""Models with symbolic input dims run compiles at their feeds' exact shapes (``specialize.py``):
planned memory and shape-bound kernels at every length, matched against onnxruntime; the
bounded cache; packed weights made once; ``Config.dynamic_batch`` for static models."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as H, numpy_helper

import fusegraph as fg
from fusegraph.errors import ConfigError, InputError
from model_builders import static_shapes, transformer_feeds
from oracle import assert_outputs_close, ort_run
from test_knobs import knob_model


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_each_length_runs_a_planned_compile_matching_onnxruntime(transformer_models, name):
    path = str(transformer_models[name])
    model = fg.compile(path)
    assert model.report.memory.unplannable, "the shape-generic compile cannot plan its activations"
    for batch, seq in ((1, 8), (1, 64), (1, 128), (2, 16)):
        feeds = transformer_feeds(seed=seq, batch=batch, seq=seq)
        assert_outputs_close(model.run(feeds), ort_run(path, feeds))
    records = model.specializations.compiled
    assert [r["shapes"]["input_ids"] for r in records] == [(1, 8), (1, 64), (1, 128), (2, 16)]
    for r in records:
        assert r["unplannable"] == 0 and r["arena_bytes"] >= r["lower_bound_bytes"] > 0
    static = fg.compile(static_shapes(path, 1, 64))
    compiled = model.specialize({"input_ids": (1, 64), "attention_mask": (1, 64)})
    assert compiled.report.memory.unplannable == []
    assert compiled.report.kernels["implementations"].keys() == static.report.kernels["implementations"].keys()
    assert compiled.report.kernel_count <= static.report.kernel_count + 1
    assert len(model.specializations.compiled) == 4, "specialize() of a kept shape compiles nothing"


def test_packed_weights_are_made_once_for_every_length(transformer_models):
    model = fg.compile(str(transformer_models["bert"]))
    first, second = (model.specialize({"input_ids": (1, s), "attention_mask": (1, s)}) for s in (8, 32))
    if not first.report.kernels.get("weight_reorders"):
        pytest.skip("no oneDNN kernels here: nothing is packed")
    assert second.report.kernels["weight_reorders"] == 0
    assert model.specializations.shared.hits >= first.report.kernels["weight_reorders"]
    feeds = transformer_feeds(seed=1, seq=32)
    assert_outputs_close(second.run(feeds), ort_run(str(transformer_models["bert"]), feeds))


def test_the_cache_keeps_the_most_recent_shapes(transformer_models):
    model = fg.compile(str(transformer_models["gpt2"]), fg.Config(shape_cache=2))
    for seq in (8, 9, 8, 10):          # the run at 8 makes 9 the least recently used
        model.run(transformer_feeds(seed=0, seq=seq))
    assert [s["input_ids"] for s in model.specializations.kept] == [(1, 8), (1, 10)]
    assert [r["shapes"]["input_ids"][1] for r in model.specializations.compiled] == [8, 9, 10]
    model.run(transformer_feeds(seed=0, seq=9))          # evicted: compiled again
    assert len(model.specializations.compiled) == 4 and len(model.specializations) == 2


def test_malformed_feeds_are_refused_before_any_compile(transformer_models):
    model = fg.compile(str(transformer_models["bert"]))
    feeds = transformer_feeds(seq=8)
    with pytest.raises(InputError, match="attention_mask.*seq"):
        model.run({**feeds, "attention_mask": np.ones((1, 9), np.int64)})
    with pytest.raises(InputError, match="input_ids.*INT64"):
        model.run({**feeds, "input_ids": feeds["input_ids"].astype(np.float32)})
    with pytest.raises(InputError, match="missing"):
        model.run({"input_ids": feeds["input_ids"]})
    with pytest.raises(InputError, match="non-negative"):
        model.specialize({"input_ids": (1, -8), "attention_mask": (1, 8)})
    assert model.specializations.compiled == []


def test_concurrent_runs_at_different_lengths(transformer_models):
    path = str(transformer_models["gpt2"])
    model = fg.compile(path)
    feeds = {seq: transformer_feeds(seed=seq, seq=seq) for seq in (8, 24)}
    want = {seq: ort_run(path, f) for seq, f in feeds.items()}
    errors = []

    def work(seq):
        try:
            for _ in range(3):
                assert_outputs_close(model.run(feeds[seq]), want[seq])
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(s,)) for s in (8, 24, 8, 24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(model.specializations.compiled) == 2


def test_reduced_precision_is_kept_at_every_shape(transformer_models):
    path = str(transformer_models["bert"])
    model = fg.compile(path, fg.Config(precision="bf16"))
    compiled = model.specialize({"input_ids": (1, 32), "attention_mask": (1, 32)})
    static = fg.compile(static_shapes(path, 1, 32), fg.Config(precision="bf16"))
    assert compiled.report.precision is model.report.precision
    assert compiled.report.op_histogram.get("Cast", 0) == static.report.op_histogram.get("Cast", 0)
    feeds = transformer_feeds(seed=3, seq=32)
    got, want = model.run(feeds)["last_hidden_state"], ort_run(path, feeds)["last_hidden_state"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_a_loaded_artifact_compiles_per_shape_like_the_compiled_model(transformer_models, tmp_path):
    path = str(transformer_models["gpt2"])
    compiled = fg.compile(path)
    compiled.save(tmp_path / "m.fgm")
    loaded = fg.load(tmp_path / "m.fgm")
    assert loaded.specializations is not None and loaded.specializations.compiled == []
    feeds = transformer_feeds(seed=5, seq=12)
    got = loaded.run(feeds)
    assert_outputs_close(got, ort_run(path, feeds))
    assert np.array_equal(got["last_hidden_state"], compiled.run(feeds)["last_hidden_state"])
    assert loaded.specializations.compiled[0]["unplannable"] == 0
    generic = fg.compile(path, fg.Config(shape_cache=0))
    generic.save(tmp_path / "generic.fgm")
    assert fg.load(tmp_path / "generic.fgm").specializations is None
    with pytest.raises(ConfigError, match="specialise"):
        fg.load(tmp_path / "generic.fgm").specialize({"input_ids": (1, 12), "attention_mask": (1, 12)})


def test_dynamic_batch_compiles_a_static_model_per_batch_size():
    x = np.random.default_rng(0).standard_normal((3, 8, 16, 16)).astype(np.float32)
    with pytest.raises(InputError, match="dim 0 must be 1"):
        fg.compile(knob_model()).run({"x": x})
    model = fg.compile(knob_model(), fg.Config(dynamic_batch=True))
    assert_outputs_close(model.run({"x": x}), ort_run(knob_model("N"), {"x": x}))
    assert_outputs_close(model.run({"x": x[:1]}), ort_run(knob_model(), {"x": x[:1]}))
    assert [r["shapes"]["x"] for r in model.specializations.compiled] == [(3, 8, 16, 16)]
    assert model.specializations.compiled[0]["unplannable"] == 0


def _fixed_batch_model() -> onnx.ModelProto:
    """Flattens with a Reshape to the constant [1, -1]: the graph fixes its batch at 1."""
    w = numpy_helper.from_array(np.ones((32, 4), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    g = H.make_graph([H.make_node("Reshape", ["x", "shape"], ["f"]), H.make_node("MatMul", ["f", "w"], ["y"])],
                     "fixed", [H.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [H.make_tensor_value_info("y", T.FLOAT, [1, 4])], [w, shape])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def test_dynamic_batch_refuses_a_graph_that_fixes_its_batch():
    model = fg.compile(_fixed_batch_model(), fg.Config(dynamic_batch=True))
    for _ in range(2):               # the second time from the refusal remembered, not a compile
        with pytest.raises(InputError, match="output 'y'.*batch"):
            model.run({"x": np.ones((2, 2, 4, 4), np.float32)})
    assert model.specializations.compiled == []
    assert model.run({"x": np.ones((1, 2, 4, 4), np.float32)})["y"].shape == (1, 4)


def test_the_knobs_are_checked():
    with pytest.raises(ConfigError, match="shape_cache"):
        fg.Config(shape_cache=-1)
    with pytest.raises(ConfigError, match="dynamic_batch"):
        fg.Config(dynamic_batch=True, shape_cache=0)
    with pytest.raises(ConfigError, match="dynamic_batch"):
        fg.compile(knob_model()).specialize({"x": (2, 8, 16, 16)})


def test_compare_reports_the_compile_its_runs_executed():
    from fusegraph.tools.compare import compare
    per_shape, generic = (compare(knob_model("N"), runs=3, budget_s=1, config=fg.Config(shape_cache=n))[1]
                          for n in (8, 0))
    assert generic.arena_bytes == 0                  # nothing of the shape-generic compile is planned
    assert per_shape.arena_bytes >= 8 * 16 * 16 * 4 and per_shape.outside_bytes == 0


def test_a_closed_dynamic_model_refuses_to_run(transformer_models):
    from fusegraph.errors import ModelClosedError
    model = fg.compile(str(transformer_models["gpt2"]), fg.Config(streams=2))
    kept = model.specialize({"input_ids": (1, 8), "attention_mask": (1, 8)})
    model.close()
    for seq in (8, 9):          # a kept shape and a new one
        with pytest.raises(ModelClosedError):
            model.run(transformer_feeds(seq=seq))
    with pytest.raises(ModelClosedError):
        kept.run(transformer_feeds(seq=8))
    with pytest.raises(ModelClosedError):
        model.specialize({"input_ids": (1, 10), "attention_mask": (1, 10)})
