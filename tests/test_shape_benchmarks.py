"""The dynamic-shape benchmarks of issue 36 keep working: ``benchmarks/variable_length.py`` (a
dynamic-axis BERT encoder under variable-length traffic) and ``benchmarks/decode.py`` (greedy
KV-cache decoding on a GPT-2 step) answer ``--help`` (and so does ``shape_profiles.py``), run end to end on a tiny model (1 layer,
hidden 64) through their child processes, and every engine's run agrees with onnxruntime
ORT_DISABLE_ALL (each engine's child body is also run in this process, so a broken engine fails
here without its process start-up). The checks they report are shown to catch a wrong answer.
No timing is asserted."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
TINY_ENCODER = dict(layers=1, hidden=64, heads=4, intermediate=256, vocab=1000, positions=64)
TINY_DECODER = dict(layers=1, hidden=64, heads=4, vocab=1000, positions=64)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


variable_length = _script("variable_length")
decode = _script("decode")


def _flags(sizes: dict) -> list[str]:
    return [a for k, v in sizes.items() for a in (f"--{k}", str(v))]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes")
    encoder = variable_length.export_encoder(folder, **TINY_ENCODER)
    decoder = decode.export_decoder(folder, **TINY_DECODER)
    return folder, encoder, decoder


@pytest.mark.parametrize("name", ["variable_length", "decode", "shape_profiles"])
def test_help(name):
    got = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got.stderr
    assert "--cache" in got.stdout
    if name != "shape_profiles":
        assert "--engines" in got.stdout and "--json" in got.stdout


def test_variable_length_end_to_end(exports, tmp_path):
    folder = exports[0]
    out = tmp_path / "varlen.json"
    got = subprocess.run([sys.executable, str(BENCH / "variable_length.py"), *_flags(TINY_ENCODER), "--requests", "5",
                          "--min-len", "4", "--max-len", "24", "--stall-lengths", "2", "--warm-runs", "1",
                          "--warm-lengths", "3,20", "--engines", "fusegraph-fgm,onnxruntime", "--cache", str(folder),
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "| fusegraph-fgm |" in got.stdout and "| onnxruntime |" in got.stdout
    result = json.loads(out.read_text())["models"][0]
    lengths = variable_length.request_lengths(5, 4, 24, 0)
    assert result["lengths"] == lengths
    assert len(result["stall_lengths"]) == 2 and not set(result["stall_lengths"]) & set(lengths)
    for engine in ("fusegraph-fgm", "onnxruntime"):
        run = result["runs"][engine][0]
        assert len(run["request_ms"]) == 5 and len(run["stalls"]) == 2
        assert result["summary"][engine]["total_s"] > 0
    checked = {(c["engine"], c["case"]) for c in result["checks"] if c["ok"]}
    assert len(checked) == len(result["checks"]) == 2 * 3      # requests 0, 1 and the first stall length
    assert set(result["warm_by_length_ms"]["fusegraph-fgm"]) == {"3", "20"}
    assert "warm latency per length" in got.stdout and "| 20 |" in got.stdout


def test_variable_length_engines_in_process(exports, tmp_path):
    """Each engine's child body on a few lengths, its saved outputs against ORT_DISABLE_ALL."""
    _, encoder, _ = exports
    lengths = [5, 17, 5]
    spec = {"onnx": str(encoder), "threads": 2, "vocab": TINY_ENCODER["vocab"], "seed": 0, "lengths": lengths,
            "stall_lengths": [9], "warm_runs": 1, "sample_requests": [0, 1, 2], "sample_stalls": [0],
            "save_dir": str(tmp_path), "fgm": str(tmp_path / "m.fgm")}
    variable_length.save_fgm(str(encoder), spec["fgm"], 2)
    for engine in variable_length.ENGINES:
        result = variable_length.engine_child({**spec, "engine": engine})
        assert len(result["request_ms"]) == 3 and result["stalls"][0]["length"] == 9
    checks = variable_length.check_outputs(str(encoder), list(variable_length.ENGINES), spec, tmp_path)
    assert len(checks) == 4 * len(variable_length.ENGINES)
    assert all(c["ok"] and c["max_rel_err"] < 1e-4 for c in checks), [c for c in checks if not c["ok"]]
    # a wrong answer is caught: one engine's saved output shifted
    file = tmp_path / "fusegraph.req1.last_hidden_state.npy"
    np.save(file, np.load(file) * 1.01)
    bad = [c for c in variable_length.check_outputs(str(encoder), ["fusegraph"], spec, tmp_path) if not c["ok"]]
    assert [(c["case"], c["length"]) for c in bad] == [("req1", 17)]


def test_decode_end_to_end(exports, tmp_path):
    folder = exports[0]
    out = tmp_path / "decode.json"
    got = subprocess.run([sys.executable, str(BENCH / "decode.py"), *_flags(TINY_DECODER), "--prompt", "6",
                          "--tokens", "4", "--engines", "fusegraph,fusegraph-kv,onnxruntime-iobinding-prealloc",
                          "--cache", str(folder), "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    result = json.loads(out.read_text())
    engines = ["fusegraph", "fusegraph-kv", "onnxruntime-iobinding-prealloc"]
    assert sorted(result["summary"]) == sorted(engines)
    for engine in engines:
        assert result["checks"][engine]["tokens_identical"] and not result["checks"][engine]["misses"]
        assert result["runs"][engine][0]["tokens"] == result["reference_tokens"]
        assert len(result["runs"][engine][0]["step_ms"]) == 4


def test_decode_engines_in_process(exports, tmp_path):
    """Every decode loop in this process gives ORT_DISABLE_ALL's tokens, logits and cache; a run
    with a changed token is reported as such."""
    _, _, decoder = exports
    shape = {"layers": 1, "hidden": 64, "heads": 4, "head": 16, "positions": 64}
    spec = {"onnx": str(decoder), "threads": 2, "vocab": TINY_DECODER["vocab"], "seed": 0, "prompt": 5, "tokens": 6,
            "sample_steps": [0, 1, 5], "model_shape": shape, "save_dir": str(tmp_path), "fgm": str(tmp_path / "m.fgm")}
    decode.save_fgm(str(decoder), spec["fgm"], 2)
    reference = decode.reference_loop(str(decoder), spec)
    for engine in decode.ENGINES:
        run = decode.engine_child({**spec, "engine": engine})
        check = decode.check_engine(engine, run, reference, tmp_path, spec["sample_steps"])
        assert check["tokens_identical"] and not check["misses"], (engine, check)
        assert check["cache_max_rel_err"] < 1e-4 and check["logits_max_rel_err"] < 1e-4
    run["tokens"] = run["tokens"][:3] + [(run["tokens"][3] + 1) % TINY_DECODER["vocab"]] + run["tokens"][4:]
    check = decode.check_engine(engine, run, reference, tmp_path, spec["sample_steps"])
    assert not check["tokens_identical"] and check["first_divergence"]["step"] == 3 and check["misses"]
