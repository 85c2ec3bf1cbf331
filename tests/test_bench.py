"""``fusegraph bench``: block alternation, random feeds, and the command end to end."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.tools.bench import alternate, bench, random_feeds_for
from fusegraph.cli.main import main
from fusegraph.ir import DType
from fusegraph.errors import UsageError


def _recorder(log: list[str], name: str):
    return lambda: log.append(name)


def test_alternate_counterbalances_the_order_of_blocks():
    log: list[str] = []
    runners = {n: _recorder(log, n) for n in "abc"}
    samples = alternate(runners, runs=12, warmup=1, block=2, settle_s=0)
    assert {n: len(s) for n, s in samples.items()} == {"a": 12, "b": 12, "c": 12}
    timed = log[3:]                       # after one warm-up call each
    blocks = [timed[i] for i in range(0, len(timed), 2)]
    assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))
    assert blocks[:6] == list("abccba")
    # every runner's block follows each other runner's block (not always the same one)
    after = Counter((prev, cur) for prev, cur in zip(blocks, blocks[1:]) if prev != cur)
    assert after["c", "a"] == 0 and after["a", "b"] > 0 and after["b", "a"] > 0


def test_random_feeds_follow_the_model_inputs():
    class Spec:
        def __init__(self, name, shape, dtype):
            self.name, self.shape, self.dtype = name, shape, DType.from_numpy(np.dtype(dtype))

    class Model:
        inputs = [Spec("x", ("batch", 3, "seq"), np.float32), Spec("ids", ("batch", "seq"), np.int64),
                  Spec("flag", (2,), np.bool_)]
    feeds = random_feeds_for(Model(), batch=4)
    assert feeds["x"].shape == (4, 3, 1) and feeds["x"].dtype == np.float32
    assert feeds["ids"].shape == (4, 1) and feeds["ids"].dtype == np.int64
    assert feeds["flag"].dtype == np.bool_ and feeds["flag"].all()


@pytest.fixture
def small_model(tmp_path):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w, b])
    path = tmp_path / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_bench_times_both_engines(small_model):
    result = bench(str(small_model), vs=("onnxruntime", "torch"), threads=1, runs=4, warmup=1)
    assert result.fusegraph_ms > 0 and set(result.peers_ms) == {"onnxruntime", "torch"}
    assert result.ratio("onnxruntime") == pytest.approx(result.fusegraph_ms / result.peers_ms["onnxruntime"])
    assert 1 <= result.kernels <= 3


def test_bench_command_prints_json(small_model, capsys):
    assert main(["bench", str(small_model), "--vs", "onnxruntime", "--threads", "1", "--runs", "3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 3 and out["threads"] == 1 and "onnxruntime" in out["ratios"]


def test_bench_runs_a_dynamic_model_at_the_sizes_given(tmp_path, capsys):
    from test_knobs import knob_model
    onnx.save(knob_model("N"), tmp_path / "dyn.onnx")
    assert main(["bench", str(tmp_path / "dyn.onnx"), "--dim", "N=3", "--runs", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shapes"] == {"x": [3, 8, 16, 16]}
    assert bench(str(tmp_path / "dyn.onnx"), vs=(), threads=1, runs=3, warmup=1, dims={"N": 2}).shapes["x"][0] == 2
    with pytest.raises(UsageError, match="no input has a symbolic dim named 'seq'"):
        bench(str(tmp_path / "dyn.onnx"), vs=(), runs=3, dims={"seq": 3})


def test_bench_rejects_an_unknown_peer_and_an_artifact_peer(small_model, tmp_path):
    with pytest.raises(UsageError, match="unknown peer"):
        bench(str(small_model), vs=("tensorrt",), runs=1, warmup=0)
    artifact = tmp_path / "small.fgm"
    fg.compile(str(small_model)).save(str(artifact))
    with pytest.raises(UsageError, match="run the .onnx model"):
        bench(str(artifact), vs=("onnxruntime",), runs=1, warmup=0)
