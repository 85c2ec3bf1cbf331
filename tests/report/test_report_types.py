"""``model.report`` is one type whether the model was compiled or loaded (issue 38): the report of
a conv net with two streams and of a transformer (bf16, so the precision part is there) is
walked node by node (dataclass fields, lists, dicts) beside the report of the same model saved
and loaded, and every node has the same type. A report part re-sealed with a wrong type is
refused with an ``ArtifactError`` naming it. ``str(report)`` is a short summary, and a rich
console prints it as a table."""
from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest
from rich.console import Console

import fusegraph as fg
from fusegraph.errors import ArtifactError
from fusegraph.report import CompileReport, MemoryReport, StreamPlan
from fusegraph.testing.zoo import random_light_model
from test_artifact import json_part_edit, reseal

LOADED_ONLY = {"report.timings": {"load"}}     # what a load adds to the report


def _walk(a, b, path: str, seen: list[str]) -> None:
    seen.append(path)
    assert type(a) is type(b), f"{path}: {type(a).__name__} after compile, {type(b).__name__} after load"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _walk(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", seen)
    elif isinstance(a, dict):
        extra = set(b) - set(a)
        assert set(a) <= set(b) and extra <= LOADED_ONLY.get(path, set()), \
            f"{path}: keys {sorted(set(a) ^ set(b))[:5]} differ"
        for k in a:
            _walk(a[k], b[k], f"{path}[{k!r}]", seen)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: {len(a)} items after compile, {len(b)} after load"
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{path}[{i}]", seen)


def _compiled_and_loaded(model, config, tmp_path, **kw):
    compiled = fg.compile(model, config, **kw)
    compiled.save(tmp_path / "m.fgm")
    return compiled, fg.load(tmp_path / "m.fgm"), tmp_path / "m.fgm"


@pytest.fixture(scope="module")
def conv_streams(tmp_path_factory):
    proto = random_light_model("inception_v1")
    got = _compiled_and_loaded(proto, fg.Config(streams=2, threads=2), tmp_path_factory.mktemp("conv"))
    yield got
    for m in got[:2]:
        m.close()


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    from model_builders import small_transformer
    module, args, _names = small_transformer("bert", hidden=64, layers=2, heads=4)
    got = _compiled_and_loaded(module, fg.Config(precision="bf16", threads=2), tmp_path_factory.mktemp("bert"),
                               example_inputs=args)
    yield got
    for m in got[:2]:
        m.close()


@pytest.mark.parametrize("which", ["conv_streams", "transformer"])
def test_loaded_report_has_the_compiled_types(which, request):
    compiled, loaded, _ = request.getfixturevalue(which)
    a, b = compiled.report, loaded.report
    assert isinstance(a.memory, MemoryReport) and isinstance(a.streams if which == "conv_streams" else a.memory,
                                                             (StreamPlan, MemoryReport))
    if which == "conv_streams":
        assert b.streams.num_streams == compiled.plan.streams.num_streams == 2
    else:
        assert b.precision["policy"] == "bf16" and b.precision["nodes"]
    seen: list[str] = []
    _walk(a, b, "report", seen)
    assert len(seen) > 500        # the walk went down to the leaves (tensors, buffers, passes)
    assert any(".memory.tensors[" in p for p in seen) and any(".passes[" in p for p in seen)
    # and the loaded report says what the compiled one said (but the load's own timing, and the
    # weights the compile packed and released: a load binds the packed forms as they are)
    want, got = a.to_dict(), b.to_dict()
    got["timings"].pop("load")
    for d in (want, got):
        del d["kernels"]["weights_released_bytes"], d["kernels"]["weight_reorders"]
    assert json.dumps(want, sort_keys=True, default=str) == json.dumps(got, sort_keys=True, default=str)


def test_report_round_trips_through_from_dict(conv_streams):
    report = conv_streams[0].report
    again = CompileReport.from_dict(json.loads(json.dumps(report.to_dict())))
    _walk(report, again, "report", [])


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["report"]["memory"].update(arena_bytes="12"), ["report.memory.arena_bytes", "int"]),
    (lambda r: r["report"]["memory"]["tensors"][3].update(offset=[1]), ["report.memory.tensors[3].offset"]),
    (lambda r: r["report"]["memory"]["buffers"][0].update(spans=[[0, 1, 2]]), ["report.memory.buffers[0].spans[0]"]),
    (lambda r: r["report"]["memory"]["buffers"][0].pop("size"), ["report.memory.buffers[0]", "'size'"]),
    (lambda r: r["report"].update(memory=[]), ["report.memory"]),
    (lambda r: r["report"]["streams"].update(per_stream={"a": 1}), ["report.streams.per_stream"]),
    (lambda r: r["report"]["streams"].update(num_streams=10 ** 9), ["report.streams", "stream count"]),
    (lambda r: r["report"]["streams"]["waits"].update(x=[777]), ["report.streams", "event"]),
    (lambda r: r["report"]["streams"]["candidates"].update(two=1.0), ["report.streams.candidates", "integer"]),
    (lambda r: r["report"]["passes"][0].update(seconds="fast"), ["report.passes[0].seconds", "float"]),
    (lambda r: r["report"]["passes"][1].update(changed=1), ["report.passes[1].changed", "bool"]),
    (lambda r: r["report"]["fusions"][0].update(nodes="n"), ["report.fusions[0].nodes"]),
    (lambda r: r["report"]["fusions"][0].pop("rule"), ["report.fusions[0]", "'rule'"]),
    (lambda r: r["report"]["kernels"].update(declined=[{"node": 1}]), ["report.kernels.declined[0]"]),
    (lambda r: r["report"]["timings"].update(load=None), ["report.timings['load']", "float"]),
    (lambda r: r["report"].update(kernel_count=True), ["report.kernel_count", "int"]),
])
def test_malformed_report_part_is_refused_by_name(conv_streams, tmp_path, edit, words):
    bad = reseal(conv_streams[2], tmp_path / "bad.fgm", parts_fn=json_part_edit("report", edit))
    with pytest.raises(ArtifactError) as info:
        fg.load(bad)
    message = str(info.value)
    assert "stored report is malformed" in message and all(w in message for w in words), message


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["report"]["precision"]["kept_fp32"].append({"node": "n", "op": 7, "why": ""}),
     ["report.precision.kept_fp32", ".op", "str"]),
    (lambda r: r["report"]["precision"].pop("by_dtype"), ["report.precision", "'by_dtype'"]),
    (lambda r: r["report"]["precision"].update(casts="2"), ["report.precision.casts"]),
    (lambda r: r["report"]["precision"]["nodes"][0].pop("class"), ["report.precision.nodes[0]", "'class'"]),
])
def test_malformed_precision_part_is_refused_by_name(transformer, tmp_path, edit, words):
    bad = reseal(transformer[2], tmp_path / "bad.fgm", parts_fn=json_part_edit("report", edit))
    with pytest.raises(ArtifactError) as info:
        fg.load(bad)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_report_str_is_a_short_summary(conv_streams, transformer):
    for compiled, loaded, _ in (conv_streams, transformer):
        for model in (compiled, loaded):
            text = str(model.report)
            lines = text.splitlines()
            assert 6 <= len(lines) <= 10 and "TensorPlan(" not in text and "PassStat(" not in text, text
            r = model.report
            assert lines[0].split(None, 1) == ["model:", r.model]
            assert f"{r.nodes_imported} imported -> {r.nodes_final}" in text
            assert f"{r.kernel_count} per run" in text and r.kernels["backend"] in text
            assert f"arena {r.memory.arena_bytes / (1 << 20):.2f} MiB" in text
            assert "passes " in text and "verify " in text
        assert "load " in str(loaded.report) and "load " not in str(compiled.report)
    assert re.search(r"^streams:\s+2 \(", str(conv_streams[0].report), re.M)
    assert "bf16 policy" in str(transformer[0].report)
    assert repr(conv_streams[1].report).startswith("<CompileReport 'inception_v1': 144 -> ")
    assert len(repr(transformer[1].report)) < 200
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(conv_streams[1].report)
    printed = out.getvalue()
    assert "compile report" in printed and "arena" in printed and "TensorPlan" not in printed
