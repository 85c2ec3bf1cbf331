"""SIGTERM drains: a request already accepted (waiting in a batch window) is answered, the
process exits 0 after logging ``draining`` and ``stopped``; a CLI given a bad repository fails
with a message, not a traceback."""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import urllib.request

import numpy as np
import tritonclient.http as th

from serve_helpers import ServerProcess, feeds_for, wait_until


def _inflight(server, model: str) -> float:
    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("fusegraph_inflight_requests{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigterm_finishes_accepted_requests(repo, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(repo[0] / "bert", root / "bert")
    ref = repo[1]["bert"]
    server = ServerProcess(root)
    try:
        feeds = feeds_for(ref, seed=3)
        result = {}

        def client():
            c = th.InferenceServerClient(server.http, network_timeout=60)
            inputs = []
            for k, v in feeds.items():
                inp = th.InferInput(k, list(v.shape), "INT64")
                inp.set_data_from_numpy(v)
                inputs.append(inp)
            result["y"] = c.infer("bert", inputs).as_numpy("last_hidden_state")

        t = threading.Thread(target=client)
        t.start()
        assert wait_until(lambda: _inflight(server, "bert") >= 1, timeout=30)
        code = server.stop(timeout=60)
        t.join(60)
    finally:
        server.stop()
    assert code == 0, "".join(server.raw[-20:])
    np.testing.assert_array_equal(result["y"], ref.run(feeds)["last_hidden_state"])
    messages = [d.get("msg") for d in server.lines]
    assert "shutdown requested: draining" in messages and messages[-1] == "stopped"


def test_cli_bad_repository(tmp_path):
    (tmp_path / "empty").mkdir()
    run = subprocess.run([sys.executable, "-m", "fusegraph.cli", "serve", str(tmp_path / "empty"), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "has no model folders" in run.stderr and "Traceback" not in run.stderr
    (tmp_path / "empty" / "m").mkdir()
    (tmp_path / "empty" / "m" / "config.toml").write_text("max_batch_size = -1\n")
    (tmp_path / "empty" / "m" / "model.onnx").write_bytes(b"not onnx")
    run = subprocess.run([sys.executable, "-m", "fusegraph.cli", "serve", str(tmp_path / "empty"), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "max_batch_size must be an integer >= 0, got -1" in run.stderr


def test_timeout_answers_504_and_frees_the_batch(repo, tmp_path):
    """``--timeout 2`` with a 10 s batch window: a lone request is answered 504 at its deadline
    (its batch is given up, not run), and a full batch right after it is answered."""
    config = tmp_path / "cfg.toml"
    config.write_text("max_batch_size = 4\nmax_queue_delay_ms = 10000\nthreads = 1\n")
    model = tmp_path / "bert.onnx"
    shutil.copy(repo[0] / "bert" / "model.onnx", model)
    ref = repo[1]["bert"]
    server = ServerProcess(model, "--config", str(config), "--timeout", "2")
    try:
        c = th.InferenceServerClient(server.http, network_timeout=60)

        def infer(feeds):
            inputs = []
            for k, v in feeds.items():
                inp = th.InferInput(k, list(v.shape), "INT64")
                inp.set_data_from_numpy(v)
                inputs.append(inp)
            return c.infer("bert", inputs).as_numpy("last_hidden_state")

        try:
            infer(feeds_for(ref, seed=1))
            raise AssertionError("a lone request in a 10 s window should time out after 2 s")
        except th.InferenceServerException as exc:
            assert exc.status() == "504" and "request timed out after 2.000 s" in exc.message()
        feeds = feeds_for(ref, seed=2, batch=4)
        np.testing.assert_allclose(infer(feeds), ref.run(feeds)["last_hidden_state"], rtol=1e-4, atol=1e-5)
    finally:
        assert server.stop() == 0
