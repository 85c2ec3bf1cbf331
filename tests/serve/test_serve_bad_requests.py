"""Malformed requests get a status code and a reason naming the input and what was expected,
and the server keeps answering good requests between them (each case is followed by one).

``CASES`` doubles as the table in the report: ``python tests/serve/test_serve_bad_requests.py HOST:PORT``
prints it against a running server whose repository has ``squeezenet`` and ``bert``.
"""
from __future__ import annotations

import gzip
import http.client
import json
import sys

import numpy as np
import pytest

X = {"name": "data_0", "datatype": "FP32", "shape": [1, 3, 224, 224]}
N = 3 * 224 * 224
RAW = np.zeros(N, np.float32).tobytes()


def _binary(inputs, blobs, extra=None):
    head = json.dumps({"inputs": inputs, **(extra or {})}).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def _bin_x(**changes):
    return {**X, **changes, "parameters": {"binary_data_size": len(RAW)}}


def _ids(seq=16, batch=1):
    return {"name": "input_ids", "datatype": "INT64", "shape": [batch, seq], "data": [1] * (batch * seq)}


def _mask(seq=16, batch=1):
    return {"name": "attention_mask", "datatype": "INT64", "shape": [batch, seq], "data": [1] * (batch * seq)}


# (what, model, body, headers, status, text the message must contain)
CASES = [
    ("unknown model", "nope", *_binary([_bin_x()], [RAW]), 404, "unknown model 'nope'"),
    ("unknown version", "squeezenet/versions/7", *_binary([_bin_x()], [RAW]), 404, "version 1 only"),
    ("body is not JSON", "squeezenet", b"{not json", {}, 400, "not valid JSON"),
    ("body is a JSON list", "squeezenet", b"[1, 2]", {}, 400, "must be a JSON object"),
    ("no inputs", "squeezenet", b'{"outputs": []}', {}, 400, "needs 'inputs'"),
    ("wrong input name", "squeezenet", *_binary([_bin_x(name="data")], [RAW]), 400,
     "no input 'data'; its inputs are 'data_0'"),
    ("missing input", "bert", json.dumps({"inputs": [_ids()]}).encode(), {}, 400,
     "missing input(s) 'attention_mask' (INT64 [-1, -1])"),
    ("input given twice", "bert", json.dumps({"inputs": [_ids(), _ids()]}).encode(), {}, 400,
     "'input_ids' is given twice"),
    ("wrong datatype", "squeezenet", *_binary([{**X, "datatype": "FP64", "parameters": {"binary_data_size": 2 * len(RAW)}}],
                                              [RAW, RAW]), 400, "'data_0' expects datatype FP32, got FP64"),
    ("unknown datatype", "squeezenet", *_binary([_bin_x(datatype="FLOAT")], [RAW]), 400, "unknown datatype 'FLOAT'"),
    ("wrong shape", "squeezenet", json.dumps({"inputs": [{**X, "shape": [1, 3, 224, 225], "data": [0.0] * (N + 672)}]}).encode(),
     {}, 400, "expects shape [1, 3, 224, 224], got [1, 3, 224, 225] (dim 3 must be 224)"),
    ("wrong rank", "squeezenet", *_binary([_bin_x(shape=[3, 224, 224])], [RAW]), 400,
     "expects shape [1, 3, 224, 224] (rank 4), got [3, 224, 224]"),
    ("shape not a list of ints", "squeezenet", *_binary([_bin_x(shape="1x3")], [RAW]), 400,
     "'shape' must be a list of integers"),
    ("negative dim", "squeezenet", *_binary([_bin_x(shape=[1, -3, 224, 224])], [RAW]), 400, "dims must be >= 0"),
    ("element count != shape", "bert", json.dumps({"inputs": [{**_ids(), "data": [1, 2, 3]}, _mask()]}).encode(), {}, 400,
     "shape [1, 16] needs 16 elements, 'data' has 3"),
    ("strings in data", "bert", json.dumps({"inputs": [{**_ids(), "data": ["a"] * 16}, _mask()]}).encode(), {}, 400,
     "'data' must hold only numbers"),
    ("floats for INT64", "bert", json.dumps({"inputs": [{**_ids(), "data": [0.5] * 16}, _mask()]}).encode(), {}, 400,
     "INT64 needs integers, 'data' holds floats"),
    ("binary size != shape", "squeezenet", *_binary([{**X, "parameters": {"binary_data_size": 12}}], [RAW[:12]]), 400,
     "needs 602112 bytes, got 12"),
    ("binary_data_size past the body", "squeezenet", *_binary([_bin_x()], [RAW[:100]]), 400,
     "binary_data_size 602112 runs past the 100 binary bytes"),
    ("trailing binary bytes", "squeezenet", *_binary([_bin_x()], [RAW, b"xx"]), 400,
     "602114 binary bytes after the JSON header, the inputs use 602112"),
    ("header length > body", "squeezenet", b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, 400,
     "Inference-Header-Content-Length must be an integer 0..14"),
    ("batch above max_batch_size", "bert", json.dumps({"inputs": [_ids(batch=5), _mask(batch=5)]}).encode(), {}, 400,
     "'input_ids': batch dim 0 must be 1..4 (max_batch_size), got 5"),
    ("symbolic dims disagree", "bert", json.dumps({"inputs": [_ids(16), _mask(8)]}).encode(), {}, 400,
     "'attention_mask' dim 1 ('seq') is 8, but input 'input_ids' has 'seq' = 16"),
    ("unknown output", "squeezenet", *_binary([_bin_x()], [RAW], {"outputs": [{"name": "prob"}]}), 400,
     "no output 'prob'; its outputs are 'softmaxout_1'"),
    ("unsupported Content-Encoding", "squeezenet", b"{}", {"Content-Encoding": "br"}, 400,
     "Content-Encoding 'br' is not supported"),
    ("corrupt gzip body", "squeezenet", b"not gzip", {"Content-Encoding": "gzip"}, 400, "not valid gzip data"),
    ("oversized body (5 MiB > 4 MiB)", "squeezenet", b" " * (5 << 20), {}, 400,
     "request body of 5242880 bytes exceeds the limit of 4194304 bytes"),
    ("gzip bomb (inflates > 4 MiB)", "squeezenet", gzip.compress(b" " * (6 << 20)), {"Content-Encoding": "gzip"}, 400,
     "inflated request body exceeds the limit of 4194304 bytes"),
]


def post(host: str, path: str, body: bytes, headers: dict, timeout: float = 60) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(host, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if response.getheader("Content-Type", "").startswith(
            "application/json") else {"raw": len(data)}
    finally:
        conn.close()


def good_request(host: str, ref) -> None:
    x = np.random.default_rng(7).standard_normal((1, 3, 224, 224)).astype(np.float32)
    body, headers = _binary([{**X, "parameters": {"binary_data_size": x.nbytes}}], [x.tobytes()],
                            {"outputs": [{"name": "softmaxout_1", "parameters": {"binary_data": True}}]})
    status, _ = post(host, "/v2/models/squeezenet/infer", body, headers)
    assert status == 200
    conn = http.client.HTTPConnection(host, timeout=60)
    conn.request("POST", "/v2/models/squeezenet/infer", body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    split = int(response.getheader("Inference-Header-Content-Length"))
    got = np.frombuffer(data[split:], np.float32).reshape(1, 1000, 1, 1)
    assert np.array_equal(got, ref.run({"data_0": x})["softmaxout_1"])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_http_request(server, repo, case):
    what, model, body, headers, status, text = case
    got_status, reply = post(server.http, f"/v2/models/{model}/infer", body, headers)
    assert got_status == status, reply
    assert text in reply["error"], reply["error"]
    good_request(server.http, repo[1]["squeezenet"])


def _grpc_cases():
    from tritonclient.grpc import service_pb2 as pb

    def req(model="squeezenet", name="data_0", datatype="FP32", shape=(1, 3, 224, 224), raw=(RAW,)):
        r = pb.ModelInferRequest(model_name=model)
        r.inputs.add(name=name, datatype=datatype, shape=list(shape))
        r.raw_input_contents.extend(raw)
        return r

    typed = pb.ModelInferRequest(model_name="squeezenet")
    typed.inputs.add(name="data_0", datatype="FP32", shape=[1, 3, 224, 224]).contents.fp32_contents.extend([0.0] * 5)
    return [
        ("grpc: unknown model", req(model="nope"), "NOT_FOUND", "unknown model 'nope'"),
        ("grpc: wrong input name", req(name="x"), "INVALID_ARGUMENT", "no input 'x'"),
        ("grpc: raw bytes != shape", req(raw=(RAW[:40],)), "INVALID_ARGUMENT", "needs 602112 bytes, got 40"),
        ("grpc: raw entries != inputs", req(raw=(RAW, RAW)), "INVALID_ARGUMENT", "raw_input_contents has 2 entries for 1 inputs"),
        ("grpc: wrong datatype", req(datatype="INT32"), "INVALID_ARGUMENT", "expects datatype FP32, got INT32"),
        ("grpc: typed contents count", typed, "INVALID_ARGUMENT", "needs 150528 elements, 'data' has 5"),
        ("grpc: oversized message", req(shape=(1, 3, 1024, 1024), raw=(b"\0" * (12 << 20),)), "RESOURCE_EXHAUSTED", ""),
    ]


@pytest.mark.parametrize("index", range(7))
def test_bad_grpc_request(server, repo, index):
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    what, request, code, text = _grpc_cases()[index]
    with grpc.insecure_channel(server.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=60)
    assert info.value.code().name == code, info.value.details()
    assert text in info.value.details()
    good_request(server.http, repo[1]["squeezenet"])


if __name__ == "__main__":  # the table for the report
    host = sys.argv[1]
    print("| request | status | message |\n| --- | --- | --- |")
    for what, model, body, headers, _, _ in CASES:
        status, reply = post(host, f"/v2/models/{model}/infer", body, headers)
        print(f"| {what} | {status} | {reply.get('error', reply)} |")
    if len(sys.argv) > 2:   # HOST:GRPC_PORT too
        import grpc
        from tritonclient.grpc import service_pb2_grpc as pb_grpc
        with grpc.insecure_channel(sys.argv[2]) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for what, request, _, _ in _grpc_cases():
                try:
                    stub.ModelInfer(request, timeout=60)
                except grpc.RpcError as exc:
                    print(f"| {what} | {exc.code().name} | {exc.details()} |")
