"""Fixtures for the server tests: a model repository and a ``fusegraph serve`` process on loopback.

The repository holds the nine light models (random He-scaled weights) as ``.fgm`` and ``.onnx``,
the BERT / GPT-2 exports, and configs that turn on dynamic batching and two instances. Every model
runs on one thread, in the server and in the references built here, so results are comparable
bit for bit. The server listens on 127.0.0.1 with ports picked by the OS (``--port 0``); its
JSON ``serving`` log line says which.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

for _mod in ("fastapi", "uvicorn", "grpc", "tritonclient.http", "tritonclient.grpc", "prometheus_client"):
    pytest.importorskip(_mod)

import onnx  # noqa: E402

import fusegraph as fg  # noqa: E402
from fusegraph.testing import zoo  # noqa: E402
from serve_helpers import BATCHED, MODELS, ServerProcess  # noqa: E402


def _random_weights(name: str):
    """A light model's random weights (seed 0) without their BatchNormalization calibration
    (NumPy only, or a parse of the process's earlier draw: safe on a second thread;
    ``_calibrated`` finishes it on the main thread)."""
    return zoo.random_light_model(name, calibrate=False)


def _calibrated(model):
    """The rest of ``zoo.random_light_model(name)``: the same model it returns."""
    return zoo.calibrate_batchnorm(model, zoo.random_feeds(model, 0))


# The nine light models and the two transformer exports, all in one repository and one server.
# The served file of each: ``.fgm`` (loaded by the server, which is quicker than compiling)
# except where the ONNX source is the point (resnet50 and BERT: dynamic batching, which needs
# the source to compile batch-size variants; shufflenet: a plain ONNX model).
ONNX_SERVED = {"shufflenet", "resnet50", "bert"}
CONFIGS = {"resnet50": BATCHED + "instances = 2\n", "bert": BATCHED}


@pytest.fixture(scope="session")
def repo(tmp_path_factory, transformer_models):
    """``REPO/<name>/model.(fgm|onnx)`` (+ ``config.toml``) and the reference model of each:
    for a ``.fgm``, the compiled model that was saved (so the round trip covers save / load as
    well); for an ONNX file, a compilation of that same file."""
    root = tmp_path_factory.mktemp("repo")
    one = fg.Config(threads=1)
    refs = {}
    light = [n for n in MODELS if n in zoo.LIGHT_MODELS]
    # Drawing the random weights (~17 s of NumPy for the nine, vgg19 alone ~7 s) runs ahead on a
    # second thread while this one calibrates and compiles (one thread): both cores work.
    with ThreadPoolExecutor(1) as pool:
        drawn = {n: pool.submit(_random_weights, n) for n in light}
        for name in MODELS:
            if name in drawn:
                source = _calibrated(drawn.pop(name).result())
            else:
                source = str(transformer_models[name])
            folder = root / name
            folder.mkdir()
            (folder / "config.toml").write_text(CONFIGS.get(name, "threads = 1\n"))
            if name in ONNX_SERVED:
                path = folder / "model.onnx"
                if isinstance(source, onnx.ModelProto):
                    onnx.save(source, str(path))
                else:
                    path.write_bytes(Path(source).read_bytes())
                refs[name] = fg.compile(str(path), config=one)
            else:
                refs[name] = fg.compile(source, config=one)
                refs[name].save(folder / "model.fgm")
    return root, refs


@pytest.fixture(scope="session")
def server(repo):
    proc = ServerProcess(repo[0], "--max-request-mb", "4")
    yield proc
    code = proc.stop()
    assert code == 0, "".join(proc.raw[-20:])
