"""Fixtures for the server tests: a model repository and a ``fusegraph serve`` process on loopback.

The repository holds light models (random He-scaled weights) as ``.fgm`` and ``.onnx``, the
BERT / GPT-2 exports, and configs that turn on dynamic batching and two instances. Every model
runs on one thread, in the server and in the references built here, so results are comparable
bit for bit. The server listens on 127.0.0.1 with ports picked by the OS (``--port 0``); its
JSON ``serving`` log line says which.
"""
from __future__ import annotations

from pathlib import Path

import pytest

for _mod in ("fastapi", "uvicorn", "grpc", "tritonclient.http", "tritonclient.grpc", "prometheus_client"):
    pytest.importorskip(_mod)

import onnx  # noqa: E402

import fusegraph as fg  # noqa: E402
from fusegraph import zoo  # noqa: E402
from serve_helpers import BATCHED, ServerProcess  # noqa: E402


def _light(name: str):
    return zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)


@pytest.fixture(scope="session")
def repo(tmp_path_factory, transformer_models):
    """``REPO/<name>/model.(fgm|onnx)`` (+ ``config.toml``) and the reference model of each."""
    root = tmp_path_factory.mktemp("repo")
    one = fg.Config(threads=1)
    refs = {}

    def add(name, source, fmt, config=""):
        folder = root / name
        folder.mkdir()
        (folder / "config.toml").write_text(config or "threads = 1\n")
        if fmt == "fgm":
            model = fg.compile(source, config=one)
            model.save(folder / "model.fgm")
            refs[name] = fg.load(folder / "model.fgm")
        else:
            path = folder / "model.onnx"
            onnx.save(source, str(path)) if isinstance(source, onnx.ModelProto) else path.write_bytes(Path(source).read_bytes())
            refs[name] = fg.compile(str(path), config=one)

    add("squeezenet", _light("squeezenet"), "fgm")
    add("shufflenet", _light("shufflenet"), "onnx")
    add("resnet50", _light("resnet50"), "onnx", BATCHED + "instances = 2\n")
    add("bert", transformer_models["bert"], "onnx", BATCHED)
    add("gpt2", transformer_models["gpt2"], "fgm")
    return root, refs


@pytest.fixture(scope="session")
def server(repo):
    proc = ServerProcess(repo[0], "--max-request-mb", "4")
    yield proc
    code = proc.stop()
    assert code == 0, "".join(proc.raw[-20:])
