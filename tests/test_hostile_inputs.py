"""Hostile inputs: every malformed model or mutated artifact ends in a typed error or a right run.

Two parts. First, one focused test per fixed defect (a missing Mul / Gemm / MatMul input, a
zero stride, an Expand bomb as output, a 4 TB sparse external-data file, CUDA without a GPU,
the arena cap, lenient import). Then the generated suites: over 600 malformed ONNX models
(``hostile_onnx.py``) and over 600 ``.fgm`` mutations (``hostile_fgm.py``, raw and re-sealed),
run by ``hostile_worker.py`` in a child process with a 20 s watchdog per case, its cwd and HOME
in empty temporary folders. A case passes when it ends in a ``fusegraph.errors`` exception or
a run whose outputs equal the oracle's (onnxruntime ORT_DISABLE_ALL, or the unmutated
artifact); it fails on any other exception, a wrong output, a signal, a hang, or a file written
outside its folder (the code-injection sentinel ``owned`` included).
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as H, numpy_helper as NH

import fusegraph as fg
from fusegraph.errors import ConfigError, KernelError, ModelLoadError, PlanError

HERE = Path(__file__).parent


def _model(nodes, inputs, outputs, inits=(), opset=17):
    return H.make_model(H.make_graph(nodes, "m", inputs, outputs, list(inits)),
                        opset_imports=[H.make_opsetid("", opset)])


X = H.make_tensor_value_info("x", T.FLOAT, [2, 3])
Y = H.make_tensor_value_info("y", T.FLOAT, None)


# ----- one test per fixed defect ---------------------------------------------------------------
@pytest.mark.parametrize("op", ["Mul", "Gemm", "MatMul"])
def test_missing_input_is_refused_at_import(op):
    with pytest.raises(ModelLoadError, match=rf"node 'y' \({op}\) has 1 inputs"):
        fg.compile(_model([H.make_node(op, ["x"], ["y"])], [X], [Y]))


@pytest.mark.parametrize("op", ["Mul", "Gemm", "MatMul"])
def test_missing_input_in_an_ir_graph_is_a_typed_error(op):
    """A graph that bypassed the frontend meets the schema arity check before any pass."""
    from fusegraph.errors import ShapeInferenceError
    from fusegraph.ir import DType, Graph
    g = Graph("ir", {"": 17})
    x = g.add_input("x", DType.FLOAT, (2, 3))
    g.outputs.append(g.add_node(op, [x], outputs=["y"], name="y").outputs[0])
    with pytest.raises(ShapeInferenceError, match=rf"node 'y' \({op}, opset 17\) has 1 inputs"):
        fg.compile(g)


@pytest.mark.parametrize("attr,value", [("strides", [0, 0]), ("dilations", [0, 1]), ("kernel_shape", [0, 0]),
                                        ("pads", [-1, 0, 0, 0]), ("group", 0), ("strides", [1])])
def test_conv_window_nonsense_is_refused(attr, value):
    w = NH.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    m = _model([H.make_node("Conv", ["x", "w"], ["y"], **{attr: value})],
               [H.make_tensor_value_info("x", T.FLOAT, [1, 1, 8, 8])], [Y], [w])
    with pytest.raises(ModelLoadError, match=rf"\(Conv\).*{attr}|{attr}.*Conv|Conv.*{attr}"):
        fg.compile(m)


def test_conv_zero_stride_in_an_ir_graph_is_a_typed_error():
    """A node that bypassed the frontend (an artifact's) meets the kernel-side check."""
    from fusegraph.errors import FusegraphError
    from fusegraph.frontends.onnx import import_onnx
    w = NH.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    g = import_onnx(_model([H.make_node("Conv", ["x", "w"], ["y"])],
                           [H.make_tensor_value_info("x", T.FLOAT, [1, 1, 8, 8])], [Y], [w]))
    g.nodes[0].attrs["strides"] = [0, 0]
    with pytest.raises(FusegraphError, match="strides"):
        fg.compile(g)


def _expand(shape):
    s = NH.from_array(np.array(shape, np.int64), "s")
    return _model([H.make_node("Expand", ["x", "s"], ["y"])], [H.make_tensor_value_info("x", T.FLOAT, [1])], [Y], [s])


def test_expand_bomb_output():
    with pytest.raises(PlanError, match=r"graph output %y .* Config.max_arena_bytes"):
        fg.compile(_expand([10 ** 5, 10 ** 5, 10 ** 3]))
    model = fg.compile(_expand([10 ** 5, 10 ** 5, 10 ** 3]), fg.Config(max_arena_bytes=None))
    with pytest.raises(KernelError, match="output 'y'"):
        model.run({"x": np.ones(1, np.float32)})


def test_arena_cap():
    s = NH.from_array(np.array([1000, 1000, 750], np.int64), "s")
    m = _model([H.make_node("ConstantOfShape", ["s"], ["y"], value=NH.from_array(np.ones(1, np.float32)))],
               [], [Y], [s])
    for level in ("O0", "O2"):
        with pytest.raises(PlanError, match=r"3000000000 bytes .* over the limit of 1048576 bytes .*%y"):
            fg.compile(m, fg.Config(level=level, max_arena_bytes=1 << 20))
    small = _model([H.make_node("Relu", ["x"], ["y"])], [X], [Y])
    assert fg.compile(small, fg.Config(max_arena_bytes=4096)).run({"x": np.ones((2, 3), np.float32)})["y"].shape == (2, 3)
    for bad in (-1, 1.5, "8G", True):
        with pytest.raises(ConfigError, match="max_arena_bytes"):
            fg.Config(max_arena_bytes=bad)
    assert fg.Config.from_dict(fg.Config(max_arena_bytes=None).to_dict()).max_arena_bytes is None


def test_sparse_4tb_external_data(tmp_path):
    with open(tmp_path / "huge.bin", "wb") as f:
        f.truncate(1 << 42)
    t = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[1 << 40], data_location=T.EXTERNAL)
    t.external_data.add(key="location", value="huge.bin")
    m = _model([H.make_node("Add", ["x", "w"], ["y"])], [H.make_tensor_value_info("x", T.FLOAT, [1])], [Y], [t])
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    with pytest.raises(ModelLoadError, match=r"tensor 'w' declares 4398046511104 bytes"):
        fg.compile(tmp_path / "m.onnx")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu():
    with pytest.raises(ConfigError, match="no CUDA device is available"):
        fg.compile(_model([H.make_node("Relu", ["x"], ["y"])], [X], [Y]), fg.Config(device="cuda"))


@pytest.mark.parametrize("case,words", [
    (lambda: _model([H.make_node("Transpose", ["x"], ["y"], perm=[1.0, 0.0])], [X], [Y]), "'perm' is FLOATS"),
    (lambda: _model([H.make_node("Softmax", ["x"], ["y"], axis="1")], [X], [Y]), "'axis' is STRING"),
    (lambda: _model([H.make_node("Relu", ["x"], []), H.make_node("Relu", ["x"], ["y"])], [X], [Y]), "has no outputs"),
    (lambda: _model([H.make_node("Relu", ["x"], ["y"])], [X], [Y], opset=99999), "opset 99999"),
    (lambda: _model([H.make_node("Relu", ["x"], ["y"])], [H.make_tensor_value_info("x", T.FLOAT, [-5, 3])], [Y]),
     "dim 0 as -5"),
    (lambda: _model([H.make_node("Cast", ["x"], ["y"])], [X], [Y]), "lacks required attribute 'to'"),
])
def test_lenient_import_is_refused(case, words):
    with pytest.raises(ModelLoadError, match=words):
        fg.compile(case())


# ----- untyped exceptions (issue 39 #13) -------------------------------------------------------
def _relu_bytes() -> bytes:
    return _model([H.make_node("Relu", ["x"], ["y"], name="n")], [X], [Y]).SerializeToString()


@pytest.mark.parametrize("field,old,new", [("op_type", b"\x04Relu", b"\x04R\xfflu"),
                                           ("graph.name", b"\x12\x01m", b"\x12\x01\xff"),
                                           ("name", b"\x1a\x01n", b"\x1a\x01\xfe")])
def test_invalid_utf8_text_is_refused_at_import(tmp_path, field, old, new):
    """issue 39 #13: a string field that is not UTF-8 (protobuf keeps it as bytes) is a
    ModelLoadError naming the field, from bytes, a file or a parsed ModelProto, not a TypeError
    or UnicodeDecodeError."""
    data = _relu_bytes()
    assert data.count(old) == 1
    bad = data.replace(old, new)
    (tmp_path / "m.onnx").write_bytes(bad)
    proto = onnx.ModelProto()
    proto.ParseFromString(bad)
    for source in (bad, tmp_path / "m.onnx", proto):
        with pytest.raises(ModelLoadError, match=rf"{field.replace('.', '[.]')} is not valid UTF-8 text"):
            fg.compile(source)


def test_dynamic_bert_at_sequence_length_0_is_an_input_error(transformer_models):
    """issue 39 #13: BERT exported with a dynamic sequence axis, run at sequence length 0: an
    InputError naming the input and the dim (its shape arithmetic cannot take an empty
    sequence), not a bare IndexError; the model still runs at length 16."""
    from fusegraph.errors import InputError
    from model_builders import transformer_feeds
    model = fg.compile(str(transformer_models["bert"]), fg.Config(threads=1))
    empty = {"input_ids": np.zeros((1, 0), np.int64), "attention_mask": np.ones((1, 0), np.int64)}
    for _ in range(2):    # the refusal is remembered, and said the same way again
        with pytest.raises(InputError, match=r"input shapes input_ids: \[1, 0\].*input 'input_ids' dim 1 \('seq'\) "
                                             r"is 0"):
            model.run(empty)
    assert model.run(transformer_feeds())["last_hidden_state"].shape == (1, 16, 768)


# ----- run-time shape bombs (issue 39 #5) ------------------------------------------------------
def _i64(name, n):
    return H.make_tensor_value_info(name, T.INT64, [n])


def _f32(name, shape):
    return H.make_tensor_value_info(name, T.FLOAT, shape)


_ONE = NH.from_array(np.ones(1, np.float32), "v")
# op -> (model, feeds asking for 4 MiB of output, feeds asking for 10^15 elements, small feeds)
BOMBS = {
    "ConstantOfShape": (lambda: _model([H.make_node("ConstantOfShape", ["s"], ["y"], value=_ONE)], [_i64("s", 2)], [Y]),
                        {"s": np.array([1024, 1024])}, {"s": np.array([10 ** 8, 10 ** 7])}, {"s": np.array([2, 3])}),
    "Expand": (lambda: _model([H.make_node("Expand", ["x", "s"], ["y"])], [_f32("x", [1]), _i64("s", 2)], [Y]),
               {"x": np.ones(1, np.float32), "s": np.array([1024, 1024])},
               {"x": np.ones(1, np.float32), "s": np.array([10 ** 8, 10 ** 7])},
               {"x": np.ones(1, np.float32), "s": np.array([2, 3])}),
    "Tile": (lambda: _model([H.make_node("Tile", ["x", "r"], ["y"])], [_f32("x", [2, 2]), _i64("r", 2)], [Y]),
             {"x": np.ones((2, 2), np.float32), "r": np.array([512, 512])},
             {"x": np.ones((2, 2), np.float32), "r": np.array([10 ** 8, 10 ** 7])},
             {"x": np.arange(4, dtype=np.float32).reshape(2, 2), "r": np.array([2, 3])}),
    "Range": (lambda: _model([H.make_node("Range", ["a", "b", "d"], ["y"])],
                             [_f32("a", []), _f32("b", []), _f32("d", [])], [Y]),
              {"a": np.array(0, np.float32), "b": np.array(1 << 20, np.float32), "d": np.array(1, np.float32)},
              {"a": np.array(0, np.float32), "b": np.array(1e15, np.float32), "d": np.array(1, np.float32)},
              {"a": np.array(1, np.float32), "b": np.array(7, np.float32), "d": np.array(1.5, np.float32)}),
    "Pad": (lambda: _model([H.make_node("Pad", ["x", "p"], ["y"])], [_f32("x", [2, 2]), _i64("p", 4)], [Y]),
            {"x": np.ones((2, 2), np.float32), "p": np.array([0, 0, 1022, 1022])},
            {"x": np.ones((2, 2), np.float32), "p": np.array([0, 0, 10 ** 8, 10 ** 7])},
            {"x": np.arange(4, dtype=np.float32).reshape(2, 2), "p": np.array([1, 0, 0, 2])}),
    "Resize": (lambda: _model([H.make_node("Resize", ["x", "", "", "z"], ["y"], mode="nearest")],
                              [_f32("x", [1, 1, 2, 2]), _i64("z", 4)], [Y]),
               {"x": np.ones((1, 1, 2, 2), np.float32), "z": np.array([1, 1, 1024, 1024])},
               {"x": np.ones((1, 1, 2, 2), np.float32), "z": np.array([1, 1, 10 ** 8, 10 ** 7])},
               {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2), "z": np.array([1, 1, 3, 5])}),
    "OneHot": (lambda: _model([H.make_node("OneHot", ["i", "d", "vals"], ["y"])], [_i64("i", 4), _i64("d", 1)], [Y],
                              [NH.from_array(np.array([0, 1], np.float32), "vals")]),
               {"i": np.arange(4), "d": np.array([1 << 18])}, {"i": np.arange(4), "d": np.array([10 ** 15])},
               {"i": np.array([0, 2, 1, 4]), "d": np.array([5])}),
}


@pytest.mark.parametrize("op", sorted(BOMBS))
def test_run_time_shape_bomb_is_refused_before_allocating(op):
    """issue 39 #5: a tensor whose size comes from the feeds is refused above Config.max_run_bytes
    (here the default: max_arena_bytes, 1 MiB) with RunLimitExceeded naming the node and the
    size; 10^15 elements are refused the same way (nothing allocated); small sizes run and
    match onnxruntime."""
    from fusegraph.errors import RunLimitExceeded
    from oracle import ort_run
    make, four_mib, absurd, small = BOMBS[op]
    model = fg.compile(make(), fg.Config(max_arena_bytes=1 << 20))
    for feeds in (four_mib, absurd):
        with pytest.raises(RunLimitExceeded, match=rf"node 'y' \({op}\) would make a tensor of shape "
                                                   rf"\[.*\] \(\d+ bytes\).*max_run_bytes \(1048576 bytes\)"):
            model.run(feeds)
    np.testing.assert_array_equal(model.run(small)["y"], ort_run(make(), small)["y"])
    assert fg.compile(make(), fg.Config(max_arena_bytes=1 << 20, max_run_bytes=8 << 20)).run(four_mib)["y"].nbytes > 1 << 20


# ----- the generated suites --------------------------------------------------------------------
FAILING = ("untyped", "mismatch", "side_effect", "crash", "lenient")
_RESTARTS = 40


def _run_suite(suite: str, tmp_path: Path, timeout_s: float = 20) -> list[dict]:
    work, cwd, home = tmp_path / "work", tmp_path / "cwd", tmp_path / "home"
    for d in (work, cwd, home):
        d.mkdir()
    out = tmp_path / f"{suite}.jsonl"
    env = dict(os.environ, HOME=str(home), FG_HOSTILE_TIMEOUT_S=str(timeout_s),
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    results: dict[int, dict] = {}
    start, total = 0, None
    for _ in range(_RESTARTS):
        proc = subprocess.run([sys.executable, str(HERE / "hostile_worker.py"), suite, str(start), str(out), str(work)],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        started, done = None, False
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            total = rec.get("total", total)
            if "start" in rec:
                started = rec
            elif "i" in rec:
                results[rec["i"]] = rec
            done = done or rec.get("done", False)
        if done or total is None:
            break
        if started is not None and started["start"] not in results:   # it died inside this case
            results[started["start"]] = {"i": started["start"], "kind": started["kind"], "name": started["name"],
                                         "outcome": "crash", "detail": f"exit {proc.returncode}: {proc.stderr[-300:]}"}
        start = max(results) + 1 if results else start + 1
        if total is not None and start >= total:
            break
    assert total is not None, f"the {suite} worker did not start: {proc.stderr[-2000:]}"
    assert not list(cwd.iterdir()), f"a case wrote into cwd: {list(cwd.iterdir())}"   # the worker cleans up
    assert {p.name for p in home.iterdir()} <= {".cache"}, f"a case wrote into HOME: {list(home.iterdir())}"
    assert not (Path.cwd() / "owned").exists() and not (Path.home() / "owned").exists()
    assert len(results) == total, f"{total - len(results)} {suite} cases never reported"
    return [results[i] for i in sorted(results)]


def _table(records: list[dict]) -> str:
    counts = collections.defaultdict(collections.Counter)
    for r in records:
        counts[r["kind"]][r["outcome"]] += 1
    outcomes = sorted({o for c in counts.values() for o in c})
    lines = ["kind".ljust(16) + "".join(o.rjust(12) for o in outcomes)]
    for kind in sorted(counts):
        lines.append(kind.ljust(16) + "".join(str(counts[kind][o]).rjust(12) for o in outcomes))
    return "\n".join(lines)


def _check(records: list[dict], minimum: int) -> None:
    print(_table(records))
    bad = [r for r in records if r["outcome"] in FAILING]
    for r in bad:
        print(f"FAIL {r['kind']} {r['name']!r}: {r['outcome']}: {r['detail']}")
    assert len(records) >= minimum
    assert not bad, f"{len(bad)} hostile cases failed; first: " + "; ".join(
        f"{r['name']!r}: {r['outcome']} {r['detail'][:160]}" for r in bad[:5])


def test_harness_tells_outcomes_apart(tmp_path):
    """A segfault and a hang are reported as crashes (and the run goes on after them), a
    file written into cwd as a side effect, an untyped error as one."""
    got = {r["name"]: r["outcome"] for r in _run_suite("selftest", tmp_path, timeout_s=2)}
    assert got == {"typed": "typed", "untyped": "untyped", "segfault": "crash", "hang": "crash",
                   "owned": "side_effect", "fine": "correct"}


def test_hostile_onnx_models(tmp_path):
    _check(_run_suite("onnx", tmp_path), 300)


def test_hostile_artifacts(tmp_path):
    _check(_run_suite("fgm", tmp_path), 300)
