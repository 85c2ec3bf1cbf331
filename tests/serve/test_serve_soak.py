"""Soak (issue 39): ``fusegraph serve`` under mixed good and bad traffic from 16 client threads
for a bounded time, on loopback, against the tiny models of ``small_models.py``.

Good requests (the MLP, alone or batched with others, JSON and binary; a Loop of a few
iterations; NaN / infinite outputs; gRPC) must all be answered 200 with the right values (an
independent NumPy reference); bad ones (wrong shapes and dtypes, broken, deep or oversized
bodies, a gzip bomb, unknown models, absurd shapes, a Loop of 10^12 iterations on a model of
its own, slow partial requests) must be answered 4xx or 503 / 504 with a JSON reason, never
500; no request may go unanswered. The server's resident memory after the run must be within
10 % of what it was after a warm-up of the same traffic. The counts and the memory are
printed (``pytest -s``)."""
from __future__ import annotations

import gzip
import http.client
import json
import random
import shutil
import socket
import threading
import time

import numpy as np

from serve_helpers import ServerProcess
from small_models import mlp_reference, small_repo

CLIENTS = 16
WARMUP_S = 4.0
SOAK_S = 14.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


class Traffic:
    """One client's requests: each ``step`` sends one, checks the answer, counts it."""

    def __init__(self, host: str, grpc_host: str, seed: int):
        self.host, self.grpc_host = host, grpc_host
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.good = self.bad = 0
        self.failures: list[str] = []
        self.conn = None

    # -- plumbing
    def post(self, path: str, body: bytes, headers: dict | None = None):
        for attempt in (0, 1):       # a kept-alive connection the server closed meanwhile: once more
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, timeout=60)
            try:
                self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                                       **(headers or {})})
                response = self.conn.getresponse()
                data = response.read()
                if response.getheader("connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return response.status, data, response
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def expect_good(self, what: str, status: int, ok: bool, data: bytes) -> None:
        if status == 200 and ok:
            self.good += 1
        else:
            self.failures.append(f"good {what}: {status} {data[:200]!r}")

    def expect_bad(self, what: str, status: int, data: bytes) -> None:
        if status >= 500 and status not in (503, 504):
            self.failures.append(f"bad {what}: answered {status} {data[:200]!r}")
            return
        try:
            reason = json.loads(data)["error"]
        except (ValueError, KeyError, TypeError):
            self.failures.append(f"bad {what}: {status} without a JSON reason: {data[:200]!r}")
            return
        if status < 400 or not reason:
            self.failures.append(f"bad {what}: {status} {reason!r}")
            return
        self.bad += 1

    # -- good requests
    def mlp_json(self):
        x = self.np_rng.standard_normal((self.rng.randint(1, 3), 8)).astype(np.float32)
        status, data, _ = self.post("/v2/models/mlp/infer", json.dumps({"inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}).encode())
        ok = status == 200 and np.allclose(np.array(json.loads(data)["outputs"][0]["data"]).reshape(-1, 4),
                                           mlp_reference(x), rtol=1e-4, atol=1e-5)
        self.expect_good("mlp json", status, ok, data)

    def mlp_binary(self):
        x = self.np_rng.standard_normal((1, 8)).astype(np.float32)
        head = json.dumps({"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32",
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
        status, data, response = self.post("/v2/models/mlp/infer", head + x.tobytes(),
                                           {"Inference-Header-Content-Length": str(len(head))})
        ok = False
        if status == 200:
            split = int(response.getheader("Inference-Header-Content-Length"))
            ok = np.allclose(np.frombuffer(data[split:], np.float32).reshape(1, 4), mlp_reference(x),
                             rtol=1e-4, atol=1e-5)
        self.expect_good("mlp binary", status, ok, data)

    def loop_small(self):
        n = self.rng.randint(0, 40)
        status, data, _ = self.post("/v2/models/loop/infer", json.dumps({"inputs": [
            {"name": "n", "shape": [], "datatype": "INT64", "data": [n]},
            {"name": "x", "shape": [4], "datatype": "FP32", "data": [0, 1, 2, 3]}]}).encode())
        ok = status == 200 and json.loads(data)["outputs"][0]["data"] == [float(n + k) for k in range(4)]
        self.expect_good("loop", status, ok, data)

    def nonfinite(self):
        status, data, _ = self.post("/v2/models/nonfinite/infer", json.dumps({"inputs": [
            {"name": "x", "shape": [4], "datatype": "FP32", "data": [-1.0, 0.0, 1.0, 4.0]}]}).encode())
        ok = status == 200 and json.loads(data)["outputs"][0]["data"][:3] == ["NaN", "-Infinity", 0.0]
        self.expect_good("nonfinite", status, ok, data)

    def grpc_mlp(self):
        import tritonclient.grpc as tg
        x = self.np_rng.standard_normal((2, 8)).astype(np.float32)
        client = tg.InferenceServerClient(self.grpc_host)
        inp = tg.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(x)
        try:
            y = client.infer("mlp", [inp], client_timeout=60).as_numpy("y")
            self.expect_good("grpc", 200, np.allclose(y, mlp_reference(x), rtol=1e-4, atol=1e-5), b"")
        except Exception as exc:  # noqa: BLE001 - counted as a failure
            self.failures.append(f"good grpc: {exc}")
        finally:
            client.close()

    # -- bad requests
    def bad_request(self):
        kind = self.rng.choice(["shape", "dtype", "not json", "deep", "unknown model", "overflow", "big",
                                "gzip bomb", "header length", "no inputs", "slow loop", "partial"])
        if kind == "partial":
            return self.partial()
        bodies = {
            "shape": json.dumps({"inputs": [{"name": "x", "shape": [1, 9], "datatype": "FP32", "data": [0.0] * 9}]}),
            "dtype": json.dumps({"inputs": [{"name": "x", "shape": [1, 8], "datatype": "INT32", "data": [0] * 8}]}),
            "not json": "{'inputs': oops",
            "deep": "[" * 5000 + "]" * 5000,
            "unknown model": json.dumps({"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32",
                                                    "data": [0.0] * 8}]}),
            "overflow": json.dumps({"inputs": [{"name": "x", "shape": [2 ** 40, 2 ** 40], "datatype": "FP32",
                                                "data": []}]}),
            "big": " " * (5 << 20),
            "header length": '{"inputs": []}',
            "no inputs": '{"outputs": []}',
            "slow loop": json.dumps({"inputs": [{"name": "n", "shape": [], "datatype": "INT64", "data": [10 ** 12]},
                                                {"name": "x", "shape": [4], "datatype": "FP32", "data": [0] * 4}]}),
        }
        headers = {}
        model = {"unknown model": "nope", "slow loop": "slowloop"}.get(kind, "mlp")
        body = bodies.get(kind, "").encode()
        if kind == "gzip bomb":
            body, headers = gzip.compress(b" " * (6 << 20)), {"Content-Encoding": "gzip"}
        if kind == "header length":
            headers = {"Inference-Header-Content-Length": "99999"}
        status, data, _ = self.post(f"/v2/models/{model}/infer", body, headers)
        self.expect_bad(kind, status, data)

    def partial(self):
        """Half a request on a raw connection, then nothing: the server answers 408 and closes."""
        host, port = self.host.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
        self.expect_bad("partial", status, data.split(b"\r\n\r\n", 1)[-1] if status else b"")

    def step(self):
        r = self.rng.random()
        if r < 0.30:
            self.mlp_json()
        elif r < 0.45:
            self.mlp_binary()
        elif r < 0.58:
            self.loop_small()
        elif r < 0.64:
            self.nonfinite()
        elif r < 0.70:
            self.grpc_mlp()
        else:
            self.bad_request()


def _run(server, seconds: float, seed: int) -> list[Traffic]:
    clients = [Traffic(server.http, server.grpc, seed + k) for k in range(CLIENTS)]
    end = time.monotonic() + seconds

    def work(c: Traffic):
        try:
            while time.monotonic() < end:
                c.step()
        except Exception as exc:  # noqa: BLE001 - a lost request
            c.failures.append(f"lost: {type(exc).__name__}: {exc}")
        finally:
            if c.conn is not None:
                c.conn.close()
    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    assert not any(t.is_alive() for t in threads), "a client never got its answer"
    return clients


def test_soak_mixed_traffic(tmp_path):
    root = small_repo(tmp_path / "repo")
    shutil.copytree(root / "loop", root / "slowloop")          # the 10^12 loops get a model of their own
    server = ServerProcess(root, "--timeout", "2", "--max-request-mb", "4", "--header-timeout", "2",
                           "--body-timeout", "2")
    try:
        warm = _run(server, WARMUP_S, seed=100)
        assert not [f for c in warm for f in c.failures], [f for c in warm for f in c.failures][:5]
        time.sleep(2.0)
        before = rss_bytes(server.proc.pid)
        clients = _run(server, SOAK_S, seed=1)
        time.sleep(3.0)                            # the last slow loops stop, their requests answered
        after = rss_bytes(server.proc.pid)
    finally:
        code = server.stop(timeout=60)
    failures = [f for c in clients for f in c.failures]
    good, bad = sum(c.good for c in clients), sum(c.bad for c in clients)
    print(f"\nsoak: {CLIENTS} clients, {SOAK_S:.0f} s: {good} good requests answered right, {bad} bad ones "
          f"refused with a reason, {len(failures)} failures; server RSS {before / 2**20:.1f} MiB after the "
          f"warm-up, {after / 2**20:.1f} MiB after the soak ({(after - before) / before:+.1%})")
    assert not failures, "\n".join(failures[:10])
    assert good > 200 and bad > 50, (good, bad)
    assert abs(after - before) <= 0.10 * before, (before, after)
    text = "".join(server.raw)
    assert code == 0 and "Traceback" not in text and '"code": 500' not in text, text[-2000:]
