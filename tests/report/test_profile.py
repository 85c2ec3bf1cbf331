"""``fusegraph.tools.profile``: per-kernel times of the real generated run as a Chrome trace.

Checks structure, never timings: the trace is valid Chrome-trace JSON, it holds one kernel
event per kernel the run launches (``report.kernel_count``), and with two streams it has two
tracks whose events respect the plan's dependencies (a node starts after its producers end)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_knobs import knob_model

import fusegraph as fg
from fusegraph.tools.profile import profile


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)}


@pytest.fixture(scope="module")
def two_streams():
    model = fg.compile(knob_model(), config=fg.Config(streams=2, threads=2))
    yield model
    model.close()


def test_trace_is_valid_chrome_json_with_one_event_per_kernel():
    model = fg.compile(knob_model(), config=fg.Config(threads=1))
    prof = profile(model, _feeds(), runs=2)
    trace = json.loads(json.dumps(prof.to_chrome_trace()))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert len(kernels) == model.report.kernel_count == len(prof.kernel_events)
    graph_nodes = {n.name: n for n in model.graph.nodes}
    for e in events:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0 and e["tid"] == 0
        node = graph_nodes[e["args"]["node"]]
        assert e["name"] == f"{node.name} ({e['args']['op']})" and node.op_type in e["args"]["op"]
        assert e["args"]["outputs"]
    text = prof.to_text()
    assert "the same kernels" in text and "plain run" in text and "time by op type" in text
    assert prof.plain_ms > 0 and sum(n for _, n, _ in prof.by_op()) == len(prof.kernels)


def test_two_streams_are_two_tracks_in_dependency_order(two_streams):
    model = two_streams
    assert model.plan.streams is not None and model.plan.streams.num_streams == 2
    prof = profile(model, _feeds(), runs=3)
    events = [e for e in prof.to_chrome_trace()["traceEvents"] if e["ph"] == "X"]
    assert len([e for e in events if e["cat"] == "kernel"]) == model.report.kernel_count
    assert {e["tid"] for e in events} == {0, 1}
    by_node = {e["args"]["node"]: e for e in events}
    for e in events:
        assert e["tid"] == model.plan.streams.stream_of[e["args"]["node"]]
    nodes = {n.name: n for n in model.graph.nodes}
    checked = 0
    for name, e in by_node.items():
        for v in nodes[name].inputs:
            if v is not None and v.producer is not None and v.producer.name in by_node:
                p = by_node[v.producer.name]
                assert e["ts"] >= p["ts"] + p["dur"] - 1e-3, (name, v.producer.name)
                checked += 1
    assert checked


def test_cli_writes_the_trace(tmp_path, capsys):
    import onnx

    from fusegraph.cli.main import main
    onnx.save(knob_model(), tmp_path / "m.onnx")
    assert main(["profile", str(tmp_path / "m.onnx"), "--runs", "2", "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "top kernels" in out and "trace written" in out
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
