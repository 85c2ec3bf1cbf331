"""A server that bounds every read and every wait (issue 39 #1, #4, #6, #8, #9, #10), against a
repository of tiny models (``small_models.py``), so each server starts in seconds.

Each test names the finding it covers. Waits are bounded; the few time limits asserted here are
generous multiples of what the behaviour needs (they tell "stopped" from "still running", not
fast from slow)."""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from serve_helpers import ServerProcess, wait_until
from small_models import mlp_reference, small_repo


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return small_repo(tmp_path_factory.mktemp("small"))


def post(host: str, path: str, body: bytes, headers: dict | None = None, timeout: float = 60):
    conn = http.client.HTTPConnection(host, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        data = response.read()
        return response.status, data
    finally:
        conn.close()


def loop_body(n: int) -> bytes:
    return json.dumps({"inputs": [{"name": "n", "shape": [], "datatype": "INT64", "data": [n]},
                                  {"name": "x", "shape": [4], "datatype": "FP32", "data": [0, 1, 2, 3]}]}).encode()


def mlp_body(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_sockets(pid: int) -> set[str]:
    """The sockets the process holds open (``socket:[inode]``)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found.add(link)
    return found


# ----- #1: a timed-out request stops computing and frees the model ------------------------------
def test_timed_out_loop_stops_and_the_next_request_is_served(small):
    """issue 39 #1: a Loop of 10^12 iterations (the trip count is the request's) with --timeout 2
    is answered 504; its run stops (the server's CPU time stops growing), the model is free: the
    next request gets a right 200 at once; SIGTERM then ends the process cleanly (exit 0, no
    "terminate called")."""
    server = ServerProcess(small, "--timeout", "2")
    try:
        t0 = time.monotonic()
        status, data = post(server.http, "/v2/models/loop/infer", loop_body(10 ** 12))
        assert status == 504 and b"timed out" in data, data
        assert time.monotonic() - t0 < 15
        time.sleep(0.5)                    # the run stops at its next iteration after the deadline
        before = cpu_seconds(server.proc.pid)
        time.sleep(1.0)
        assert cpu_seconds(server.proc.pid) - before < 0.5, "the timed-out run is still computing"
        t0 = time.monotonic()
        status, data = post(server.http, "/v2/models/loop/infer", loop_body(7))
        assert status == 200, data
        assert json.loads(data)["outputs"][0]["data"] == [7.0, 8.0, 9.0, 10.0]
        assert time.monotonic() - t0 < 5, "the model was not free for the next request"
        # a second long request in flight when SIGTERM comes: the process still exits cleanly
        threading.Thread(target=lambda: post(server.http, "/v2/models/loop/infer", loop_body(10 ** 12)),
                         daemon=True).start()
        time.sleep(0.5)
    finally:
        code = server.stop(timeout=60)
    text = "".join(server.raw)
    assert code == 0, text[-2000:]
    assert "terminate called" not in text and "Traceback" not in text, text[-2000:]


# ----- #9: a short drain answers the requests in flight with a JSON 503 -------------------------
def test_short_drain_answers_inflight_requests_503(small):
    """issue 39 #9: SIGTERM with --drain 1 while 6 long requests run or wait: each is answered a
    JSON 503 "shutting down" before the process exits 0; no traceback in the log."""
    server = ServerProcess(small, "--timeout", "60", "--drain", "1")
    answers = []

    def client():
        answers.append(post(server.http, "/v2/models/loop/infer", loop_body(10 ** 12), timeout=60))
    threads = [threading.Thread(target=client) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        code = server.stop(timeout=60)
        for t in threads:
            t.join(30)
    finally:
        server.stop()
    text = "".join(server.raw)
    assert code == 0 and "Traceback" not in text, text[-3000:]
    assert len(answers) == 6
    for status, data in answers:
        assert status == 503, data
        assert "shutting down" in json.loads(data)["error"]


# ----- #6: header and body read timeouts ---------------------------------------------------------
def test_slow_partial_requests_are_closed(small):
    """issue 39 #6: with --header-timeout 1 --body-timeout 1, 30 raw connections that send
    nothing, part of their headers, or part of their body are answered 408 and closed within a
    few seconds, and the server holds no socket for them any more; a good request is served
    meanwhile."""
    server = ServerProcess(small, "--header-timeout", "1", "--body-timeout", "1")
    socks = []
    try:
        host, port = server.http.split(":")
        x = np.ones((1, 8), np.float32)
        assert post(server.http, "/v2/models/mlp/infer", mlp_body(x))[0] == 200    # lazily made threads exist
        time.sleep(0.5)
        base = open_sockets(server.proc.pid)
        head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        for k in range(30):
            s = socket.create_connection((host, int(port)), timeout=10)
            if k % 3 == 1:
                s.sendall(head)                                        # headers never finish
            elif k % 3 == 2:
                s.sendall(head + b"Content-Length: 1000\r\n\r\n" + b'{"inputs": [')   # the body stalls
            socks.append(s)
        assert wait_until(lambda: len(open_sockets(server.proc.pid) - base) >= 30, timeout=10)
        status, data = post(server.http, "/v2/models/mlp/infer", mlp_body(x))
        assert status == 200
        answered = 0
        for s in socks:
            s.settimeout(10)
            data = b""
            while True:                                  # the server closes every one of them
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            answered += data.startswith(b"HTTP/1.1 408")
        assert answered == 30, answered
        assert wait_until(lambda: not open_sockets(server.proc.pid) - base, timeout=10), \
            open_sockets(server.proc.pid) - base
    finally:
        for s in socks:
            s.close()
        assert server.stop() == 0


# ----- #4 / #8: JSON decoded off the event loop; bad shapes and bodies are 400s -----------------
@pytest.fixture(scope="module")
def server(small):
    proc = ServerProcess(small, "--max-request-mb", "64")
    yield proc
    assert proc.stop() == 0, "".join(proc.raw[-20:])


def test_health_stays_live_while_big_bad_bodies_decode(server):
    """issue 39 #4: four 40 MB JSON bodies with a wrong shape, sent at once: each is answered 400
    naming the shape, and /v2/health/live answers every 50 ms poll within a second throughout
    (before, each body's decode held the event loop for one to two seconds)."""
    x = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32",
                                   "data": x.tolist()}]}).encode()
    assert len(body) > 35_000_000
    answers, worst = [], [0.0]
    done = threading.Event()

    def poll():
        conn = http.client.HTTPConnection(server.http, timeout=30)
        while not done.is_set():
            t0 = time.monotonic()
            conn.request("GET", "/v2/health/live")
            assert conn.getresponse().read() == b'{"live":true}'
            worst[0] = max(worst[0], time.monotonic() - t0)
            time.sleep(0.05)
        conn.close()
    poller = threading.Thread(target=poll)
    poller.start()
    senders = [threading.Thread(target=lambda: answers.append(post(server.http, "/v2/models/mlp/infer", body)))
               for _ in range(4)]
    try:
        for t in senders:
            t.start()
        for t in senders:
            t.join(120)
    finally:
        done.set()
        poller.join(30)
    assert len(answers) == 4
    for status, data in answers:
        assert status == 400 and b"needs 8 elements" in data, data[:300]
    assert worst[0] < 1.0, f"/v2/health/live took {worst[0]:.2f} s while bodies were decoded"


BAD = [
    ("shape [2^40, 2^40]", {"inputs": [{"name": "x", "shape": [2 ** 40, 2 ** 40], "datatype": "FP32", "data": []}]},
     {}, "needs 1208925819614629174706176 elements"),
    ("shape [2^70]", {"inputs": [{"name": "x", "shape": [2 ** 70], "datatype": "FP32", "data": []}]}, {},
     "dims must be below 2^63"),
    ("shape [0, 2^62] binary", {"inputs": [{"name": "x", "shape": [0, 2 ** 62], "datatype": "FP32",
                                            "parameters": {"binary_data_size": 0}}]}, "binary", ""),
    ("JSON nested 100 000 deep", b"[" * 100_000 + b"]" * 100_000, {}, "nested deeper than 64"),
    ("data nested 100 000 deep", b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": '
     + b"[" * 100_000 + b"]" * 100_000 + b"}]}", {}, "nested deeper than 64"),
    ("non-ASCII Inference-Header-Content-Length", b'{"inputs": []}',
     {"Inference-Header-Content-Length": "\u00b2"}, "Inference-Header-Content-Length must be an integer"),
    ("non-ASCII Content-Encoding", b"{}", {"Content-Encoding": "gz\u00efp"}, "is not supported"),
    ("output parameters not an object", {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32",
                                                     "data": [0.0] * 8}], "outputs": [{"name": "y", "parameters": 3}]},
     {}, "'parameters' must be an object"),
    ("NaN string in INT64 data", {"inputs": [{"name": "n", "shape": [], "datatype": "INT64", "data": ["NaN"]},
                                             {"name": "x", "shape": [4], "datatype": "FP32", "data": [0, 0, 0, 0]}]},
     {}, "must hold only numbers"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_request_is_a_400_with_a_reason(server, case):
    """issue 39 #8: each used to be answered 500 (ValueError, OverflowError, RecursionError, a
    non-ASCII header); now 400 with a reason, and the server serves the next request."""
    what, body, headers, text = case
    model = "loop" if "INT64" in what else "mlp"
    if headers == "binary":
        head = json.dumps(body).encode()
        body, headers = head, {"Inference-Header-Content-Length": str(len(head))}
    elif isinstance(body, dict):
        body = json.dumps(body).encode()
    headers = {k: v.encode("latin-1") if not v.isascii() else v for k, v in headers.items()}
    status, data = post(server.http, f"/v2/models/{model}/infer", body, headers)
    assert status == 400, data[:300]
    assert text in json.loads(data)["error"]
    x = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    status, data = post(server.http, "/v2/models/mlp/infer", mlp_body(x))
    assert status == 200
    np.testing.assert_allclose(json.loads(data)["outputs"][0]["data"], mlp_reference(x).ravel(), rtol=1e-5, atol=1e-6)


def test_grpc_shape_overflow_is_invalid_argument(server):
    """issue 39 #8: a gRPC request whose shape's element count passes 2^63 is INVALID_ARGUMENT."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[2 ** 40, 2 ** 40])
    request.raw_input_contents.append(b"")
    with grpc.insecure_channel(server.grpc) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "needs" in info.value.details()


def test_nan_and_infinite_outputs_are_valid_json(server):
    """issue 39 #8: NaN and infinities are written as the strings "NaN", "Infinity",
    "-Infinity" (protobuf's JSON mapping), so the body is strict JSON; tritonclient reads them
    back as the float values, and they are accepted as inputs the same way."""
    import tritonclient.http as th

    def strict(token):
        raise ValueError(f"not JSON: {token}")
    status, data = post(server.http, "/v2/models/nonfinite/infer",
                        json.dumps({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32",
                                                "data": [-1.0, 0.0, 1.0, "Infinity"]}]}).encode())
    assert status == 200, data
    out = {o["name"]: o["data"] for o in json.loads(data, parse_constant=strict)["outputs"]}
    assert out["y"] == ["NaN", "-Infinity", 0.0, "Infinity"] and out["z"] == [-1.0, "Infinity", 1.0, 0.0]
    client = th.InferenceServerClient(server.http, network_timeout=60)
    inp = th.InferInput("x", [4], "FP32")
    inp.set_data_from_numpy(np.array([-1, 0, 1, 2], np.float32), binary_data=False)
    result = client.infer("nonfinite", [inp], outputs=[th.InferRequestedOutput("y", binary_data=False)])
    y = result.as_numpy("y")
    assert np.isnan(y[0]) and y[1] == -np.inf and y[2] == 0 and y[3] == np.float32(np.log(2.0))


# ----- #10: an absurd batch size with warmup is refused at start --------------------------------
def test_absurd_max_batch_size_with_warmup_is_refused_at_start(tmp_path):
    """issue 39 #10: max_batch_size = 10^9 with warmup is a ConfigError at start (exit 2, the
    key named), and so is a batch whose inputs and outputs alone pass Config.max_arena_bytes."""
    from fusegraph.errors import ConfigError
    from fusegraph.serve.model import ServedModel
    from fusegraph.serve.settings import settings_from_mapping
    root = small_repo(tmp_path / "repo")
    (root / "mlp" / "config.toml").write_text("max_batch_size = 1000000000\nwarmup = true\nthreads = 1\n")
    run = subprocess.run([sys.executable, "-m", "fusegraph.cli", "serve", str(root), "--port", "0",
                          "--grpc-port", "-1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "max_batch_size must be at most 65536" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    settings = settings_from_mapping({"max_batch_size": 65536, "warmup": True, "threads": 1,
                                      "max_arena_bytes": 1 << 20})
    with pytest.raises(ConfigError, match=r"warmup would compile batch 65536.*3145728 bytes.*max_arena_bytes"):
        ServedModel("mlp", root / "mlp" / "model.onnx", settings)
