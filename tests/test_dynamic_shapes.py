"""One compile serves every shape (issue 36): a model with symbolic input dims is optimised and
bound once; each new input shape costs a frame (``runtime/frames.py``: the shapes evaluated,
a memory plan for its bucket of shapes, arena views), never a pass or a weight hash. Checked
against onnxruntime ORT_DISABLE_ALL at many lengths, compiled and loaded, on several streams,
with declared ranges, ``dynamic_batch``, and a decoder's KV cache kept inside fusegraph."""
from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as H, numpy_helper

import fusegraph as fg
from fusegraph.errors import ConfigError, InputError
from model_builders import gpt2_kv_cache_onnx, transformer_feeds
from oracle import assert_outputs_close, ort_run
from test_knobs import knob_model

LENGTHS = ((1, 8), (1, 64), (1, 127), (2, 16), (1, 9), (1, 1))


def _frames(model):
    return model._executor.frame_runner.frames


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_every_length_runs_one_compile_in_planned_memory(transformer_models, name):
    path = str(transformer_models[name])
    model = fg.compile(path)
    assert model.plan.symbolic and model.specializations is None
    for batch, seq in LENGTHS:
        feeds = transformer_feeds(seed=seq, batch=batch, seq=seq)
        assert_outputs_close(model.run(feeds), ort_run(path, feeds))
    frames = _frames(model)
    assert frames.stats["frames"] == len(LENGTHS)
    runner = model._executor.frame_runner
    assert not runner.program.dynamic, "every activation's shape is known before the run"
    written = {id(v) for v in frames.planned}
    outputs = {id(v) for v in model._executor.graph.outputs}
    for call in model._executor.binding.calls:       # products, norms, attention: into the arena
        if call.node.op_type in ("LinearAct", "Linear", "SkipLayerNorm", "ScaledDotProductAttention"):
            # a graph output is its kernel's own tensor, handed over without a copy out of the arena
            assert all((id(o) in written) != (id(o) in outputs) for o in call.node.outputs), call.node.name
    impls = model.report.kernels["implementations"]
    assert sum(n for k, n in impls.items() if k != "portable") >= 8      # oneDNN products, run-time M
    buckets = model.memory_buckets()
    assert 1 <= len(buckets) <= len(LENGTHS)
    for b in buckets:            # each plan's arena within twice the bytes live at its largest shape
        assert 0 < b["arena_bytes"] <= 2 * b["lower_bound_bytes"], b


def test_a_new_shape_runs_no_pass_and_hashes_no_weight(transformer_models, monkeypatch):
    model = fg.compile(str(transformer_models["bert"]))
    model.run(transformer_feeds(seq=8))

    def forbidden(*args, **kwargs):
        raise AssertionError("a run at a new shape must not run a pass or hash a weight")
    import fusegraph.passes.manager as manager
    monkeypatch.setattr(manager.PassManager, "run", forbidden)
    monkeypatch.setattr(hashlib, "sha256", forbidden)
    for seq in (5, 31, 77, 120):
        model.run(transformer_feeds(seed=seq, seq=seq))
    assert _frames(model).stats["frames"] == 5


def test_a_loaded_artifact_runs_the_same(transformer_models, tmp_path):
    path = str(transformer_models["gpt2"])
    model = fg.compile(path)
    model.save(tmp_path / "m.fgm")
    loaded = fg.load(tmp_path / "m.fgm")
    assert loaded.plan.symbolic and loaded.specializations is None
    assert loaded.report.kernels["implementations"] == model.report.kernels["implementations"]
    for batch, seq in ((1, 12), (1, 100), (2, 7)):
        feeds = transformer_feeds(seed=seq, batch=batch, seq=seq)
        got = loaded.run(feeds)
        assert_outputs_close(got, ort_run(path, feeds))
        for k, v in model.run(feeds).items():
            np.testing.assert_array_equal(got[k], v)


def test_a_declared_range_is_enforced(transformer_models):
    path = str(transformer_models["bert"])
    model = fg.compile(path, fg.Config(shapes={"seq": (4, 64)}))
    assert model.config.shapes == (("seq", 4, 64),)
    model.run(transformer_feeds(seq=64))
    with pytest.raises(InputError, match=r"input 'input_ids' dim 1 \('seq'\) is 65, outside the declared range 4..64"):
        model.run(transformer_feeds(seq=65))
    with pytest.raises(InputError, match="outside the declared range"):
        model.run(transformer_feeds(seq=3))
    with pytest.raises(ConfigError, match="'length', which is no symbolic dim"):
        fg.compile(path, fg.Config(shapes={"length": (1, 8)}))
    for bad in ({"seq": (9, 8)}, {"seq": (-1, 8)}, {"seq": 8}, (("seq", 1),)):
        with pytest.raises(ConfigError, match="Config.shapes"):
            fg.Config(shapes=bad)


def test_dynamic_batch_is_one_compile_for_every_batch(tmp_path):
    """... and survives save / load (the loaded model's inputs keep the symbolic batch)."""
    model = fg.compile(knob_model(), fg.Config(dynamic_batch=True))
    model.save(tmp_path / "m.fgm")
    loaded = fg.load(tmp_path / "m.fgm")
    x = np.random.default_rng(0).standard_normal((5, 8, 16, 16)).astype(np.float32)
    for m in (model, loaded):
        assert m.plan.symbolic and m.inputs[0].shape[0] == "batch" and m.config.dynamic_batch
        for n in (3, 1, 5):
            assert_outputs_close(m.run({"x": x[:n]}), ort_run(knob_model("N"), {"x": x[:n]}))


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
    with pytest.raises(InputError, match="output\\(s\\) 'y' keep batch 1"):
        model.run({"x": np.ones((2, 2, 4, 4), np.float32)})
    assert model.run({"x": np.ones((1, 2, 4, 4), np.float32)})["y"].shape == (1, 4)


def test_concurrent_runs_at_different_lengths(transformer_models):
    path = str(transformer_models["bert"])
    model = fg.compile(path)
    wants = {seq: ort_run(path, transformer_feeds(seed=seq, seq=seq)) for seq in (6, 19, 40)}
    errors = []

    def worker(seq):
        try:
            for _ in range(3):
                assert_outputs_close(model.run(transformer_feeds(seed=seq, seq=seq)), wants[seq])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(s,)) for s in wants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("streams", [2, 4])
def test_streams_are_bitwise_at_two_lengths(transformer_models, streams):
    path = str(transformer_models["bert"])
    one = fg.compile(path, fg.Config(threads=2))
    many = fg.compile(path, fg.Config(threads=2, streams=streams))
    assert many.plan.streams is not None and many.plan.streams.num_streams > 1
    for seq in (7, 45):
        feeds = transformer_feeds(seed=seq, seq=seq)
        for k, v in one.run(feeds).items():
            np.testing.assert_array_equal(many.run(feeds)[k], v)


def test_nan_and_inf_in_the_feeds_stay_exact(transformer_models):
    """The layer norms' exact path on run-time shapes: an embedding of 1e38 overflows a float32
    row sum; onnxruntime computes the row in float64, and so does fusegraph."""
    path = str(transformer_models["bert"])
    model = fg.compile(path)
    feeds = transformer_feeds(seq=10)
    import onnx as _onnx
    m = _onnx.load(path)
    table = next(i for i in m.graph.initializer if "word_embeddings" in i.name)
    rows = numpy_helper.to_array(table).copy()
    token = int(feeds["input_ids"][0, 2])
    rows[token, :4] = [3e37, -3e37, np.inf, 1.0]
    table.CopyFrom(numpy_helper.from_array(rows, table.name))
    got = fg.compile(m).run(feeds)["last_hidden_state"]
    want = ort_run(m, feeds)["last_hidden_state"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert model.run(feeds)["last_hidden_state"].shape == want.shape


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    path, _ = gpt2_kv_cache_onnx(tmp_path_factory.mktemp("kv") / "gpt2kv.onnx", layers=2, hidden=64, heads=4)
    return str(path)


def _greedy(step, prompt, tokens: int):
    """(tokens, logits of each step) of a greedy decode; ``step(ids) -> logits``."""
    out, logits, ids = [], [], prompt
    for _ in range(tokens):
        got = step(ids)
        logits.append(got)
        nxt = int(got[0, -1].argmax())
        out.append(nxt)
        ids = np.array([[nxt]], np.int64)
    return out, logits


def _close(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


@pytest.mark.parametrize("loaded", [False, True])
def test_kv_cache_session_decodes_as_the_plain_runs_and_onnxruntime(decoder, loaded, tmp_path):
    """32 greedy tokens: the logits of every step as onnxruntime's (ORT_DISABLE_ALL), with the
    presents fed back by the caller and with the cache kept in a KV session; the decoder's
    products run one row on the matrix-vector kernel over plain weights."""
    model = fg.compile(decoder)
    if loaded:
        model.save(tmp_path / "decoder.fgm")
        model = fg.load(tmp_path / "decoder.fgm")
    impls = model.report.kernels["implementations"]
    if any(k.startswith("brg") for k in impls):
        assert all("sgemm" in k for k in impls if k.startswith("brg")), impls
    prompt = np.random.default_rng(0).integers(0, 1000, (1, 6)).astype(np.int64)
    names = [f"past_{i}" for i in range(4)]

    def plain(run):
        state = {n: np.zeros((1, 4, 0, 16), np.float32) for n in names}

        def step(ids):
            total = state[names[0]].shape[2] + ids.shape[1]
            out = run({"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **state})
            state.update({n: out[f"present_{i}"] for i, n in enumerate(names)})
            return out["logits"]
        step.state = state
        return step
    reference = plain(lambda f: dict(zip(["logits"] + [f"present_{i}" for i in range(4)],
                                         ort_run(decoder, f).values())))
    want, want_logits = _greedy(reference, prompt, 32)
    got, logits = _greedy(plain(model.run), prompt, 32)
    assert got == want
    _close(logits, want_logits)
    session = model.kv_cache(capacity=8)             # grows twice on the way to 38 positions

    def cached(ids):
        out = session.run({"input_ids": ids, "attention_mask": np.ones((1, session.length + ids.shape[1]), np.int64)})
        assert sorted(out) == ["logits"]
        return out["logits"]
    got, logits = _greedy(cached, prompt, 32)
    assert got == want
    _close(logits, want_logits)
    assert session.length == 6 + 32 - 1 and session.nbytes >= 4 * 4 * 64 * 16 * 4
    for i, n in enumerate(names):      # the kept cache: the presents onnxruntime's loop fed back last
        np.testing.assert_allclose(session.cache(f"present_{i}"), reference.state[n], rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="not a cache"):
        session.cache("logits")
    session.reset()
    assert _greedy(cached, prompt, 4)[0] == want[:4]
    with pytest.raises(InputError, match="feeds 'past_0'"):
        session.run({"input_ids": prompt, "attention_mask": np.ones((1, 6), np.int64),
                     "past_0": np.zeros((1, 4, 0, 16), np.float32)})


def test_a_kv_session_hands_the_guard_its_caches_magnitude(decoder, monkeypatch):
    """The guarded kernels' check (the largest ``|x|`` of the float feeds) reads no kept cache:
    each buffer's magnitude is the most of the rows appended to it, as NumPy finds over the
    cache, and the run's measurement takes it (NaN in it: NaN, so the exact kernels run). The
    plain runs, whose pasts come from the caller, are read."""
    import torch
    from fusegraph.runtime.backends.cpu import guard
    model = fg.compile(decoder)
    state = model._executor.backend.run_state
    assert state.needed                         # the decoder has guarded kernels
    read = []
    grown = guard._grown
    monkeypatch.setattr(guard, "_grown", lambda seen, t, view: (read.append(tuple(t.shape)), grown(seen, t, view))[1])
    session = model.kv_cache(capacity=16)
    prompt = np.random.default_rng(3).integers(0, 1000, (1, 5)).astype(np.int64)
    ids = prompt
    for _ in range(4):
        read.clear()
        before = [float(np.abs(session.cache(f"present_{i}")).max()) for i in range(4)] if session.length else [0.0] * 4
        out = session.run({"input_ids": ids, "attention_mask": np.ones((1, session.length + ids.shape[1]), np.int64)})
        assert not [s for s in read if len(s) == 4], read          # no past [1, 4, L, 16] was read
        assert state.m >= max(before)
        for i, b in enumerate(session.buffers):
            assert b.magnitude == float(np.abs(session.cache(b.pair.output)).max())
        ids = np.array([[int(out["logits"][0, -1].argmax())]], np.int64)
    past = {f"past_{i}": session.cache(f"present_{i}") for i in range(4)}
    read.clear()
    model.run({"input_ids": ids, "attention_mask": np.ones((1, session.length + 1), np.int64), **past})
    assert sum(len(s) == 4 for s in read) == 4                   # the caller's pasts are read
    state.measure([None, None], {0: 2.0, 1: float("nan")})
    assert np.isnan(state.m)
    state.measure([torch.tensor([float("nan"), 1.0])], {0: 3.0})   # a known input is not read again
    assert state.m == 3.0
    session.reset()
    assert all(b.magnitude == 0.0 and b.length == 0 for b in session.buffers)


def test_bench_decode_prints_ms_per_token_and_the_same_tokens(decoder, capsys):
    """``fusegraph bench DECODER --decode N --vs onnxruntime``: the KV session, the plain runs and
    onnxruntime each run the greedy loop and choose the same tokens (exit 0)."""
    from fusegraph.cli.main import main
    assert main(["bench", decoder, "--decode", "5", "--prompt", "4", "--vs", "onnxruntime", "--threads", "1",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["same_tokens"] and got["prompt"] == 4 and got["tokens"] == 5
    assert len(got["engines"]) == 3 and all(e["token_ms"] > 0 for e in got["engines"].values())


def test_kv_cache_needs_a_decoder(transformer_models):
    with pytest.raises(ConfigError, match="no KV cache"):
        fg.compile(str(transformer_models["bert"])).kv_cache()
    with pytest.raises(ConfigError, match="no symbolic input dim"):
        fg.compile(knob_model()).kv_cache()


def test_per_shape_compiles_stay_an_option(transformer_models):
    path = str(transformer_models["bert"])
    model = fg.compile(path, fg.Config(shape_cache=2))
    for seq in (8, 16, 24):
        feeds = transformer_feeds(seed=seq, seq=seq)
        assert_outputs_close(model.run(feeds), ort_run(path, feeds))
    assert [r["shapes"]["input_ids"] for r in model.specializations.compiled] == [(1, 8), (1, 16), (1, 24)]
    assert len(model.specializations) == 2


def test_a_closed_dynamic_model_refuses_to_run(transformer_models):
    from fusegraph.errors import ModelClosedError
    model = fg.compile(str(transformer_models["gpt2"]), fg.Config(streams=2))
    model.run(transformer_feeds(seq=8))
    model.close()
    for seq in (8, 9):          # a kept shape and a new one
        with pytest.raises(ModelClosedError):
            model.run(transformer_feeds(seq=seq))



def test_frame_stats_count_the_frames_and_plans_of_new_shapes(transformer_models):
    path = str(transformer_models["bert"])
    model = fg.compile(path, fg.Config(threads=1))
    assert model.frame_stats()["frames"] == 0
    for seq in (12, 5, 9, 5, 12):      # the longest first: the arena does not grow (which drops the frames)
        model.run(transformer_feeds(seed=seq, seq=seq))
    stats = model.frame_stats()
    assert stats["frames"] == 3 and stats["frames_ahead"] == 0          # 5 and 12 came back: their frames kept
    assert stats["plans"] >= 1 and stats["frame_seconds"] >= stats["plan_seconds"] > 0
    per_shape = fg.compile(path, fg.Config(threads=1, shape_cache=8))
    static = per_shape.specialize({k: v.shape for k, v in transformer_feeds(seq=6).items()})
    assert static.frame_stats() == {}
