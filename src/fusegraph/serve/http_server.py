"""The KServe v2 REST front end (FastAPI on uvicorn), as Triton speaks it.

    GET  /v2/health/live | /v2/health/ready          200, or 503 when not ready / draining
    GET  /v2                                          server metadata
    GET  /v2/models/{name}[/versions/{v}]             model metadata (inputs, outputs, -1 = any size)
    GET  /v2/models/{name}[/versions/{v}]/ready       200 / 404
    GET  /v2/models/{name}[/versions/{v}]/config      Triton-style config (max_batch_size, ...)
    POST /v2/models/{name}[/versions/{v}]/infer       JSON tensors and the binary-tensor extension
    POST /v2/repository/index                         the models
    GET  /metrics                                     Prometheus text format

Binary tensors: when the ``Inference-Header-Content-Length`` header is present, the body is
that many bytes of JSON followed by each input's raw bytes (``parameters.binary_data_size``),
in input order; outputs asked for with ``binary_data`` (or ``binary_data_output`` for all) come
back the same way. Request bodies are read in chunks up to ``max_request_bytes`` (gzip and
deflate bodies are inflated up to the same bound), and the bodies held at once are bounded
(``BodyBudget``: 503 past it). Decoding a body and encoding a response run on
``DECODE_THREADS`` worker threads, never on the event loop, and the JSON parser holds the
interpreter only briefly at a time (``json_body.py``), so health checks and other requests are
answered while a large body is decoded. NaN / infinite outputs are written as the strings
``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` (``tensors.json_values``). Every refusal is
``{"error": reason}``; while the server shuts down, new requests get a JSON 503.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .core import Core
from ..report.version import FUSEGRAPH_VERSION
from .json_body import loads
from .tensors import (RequestError, check_shape, datatype_of_array, from_bytes, from_values, json_values,
                      status_of)

log = logging.getLogger("fusegraph.serve")
HEADER = "inference-header-content-length"
BODY_BUDGET_REQUESTS = 4   # request bodies of the largest size held at once (see BodyBudget)


class BodyBudget:
    """The bytes of request bodies the server holds at once (read, waiting for their decode,
    decoding), bounded: a request that would pass the bound is refused with 503 instead of
    growing memory with the number of clients."""

    def __init__(self, total: int):
        self.total, self.held = total, 0

    def take(self, n: int) -> None:
        if self.held + n > self.total:
            raise RequestError(f"the server holds {self.held} bytes of request bodies already (at most "
                               f"{self.total}); retry later", 503)
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


async def _read_body(request: Request, limit: int, budget: BodyBudget, held: list[int]) -> bytes:
    """The body, at most ``limit`` bytes, counted against ``budget`` (``held[0]``: what this
    request took, for the caller to give back)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes "
                           f"(--max-request-mb)")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(f"request body exceeds the limit of {limit} bytes (--max-request-mb)")
            budget.take(len(chunk))
            held[0] += len(chunk)
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError("the client closed the connection (or sent its body too slowly) before "
                           "the body was read", 408) from None
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding not in ("identity", "gzip", "deflate"):
        raise RequestError(f"Content-Encoding {encoding[:40]!r} is not supported; use gzip, deflate or none")
    return b"".join(chunks)


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip / deflate body inflated up to ``limit`` bytes (on a decode thread)."""
    if encoding not in ("gzip", "deflate"):
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        body = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestError(f"request body is not valid {encoding} data: {exc}") from None
    if len(body) > limit:
        raise RequestError(f"inflated request body exceeds the limit of {limit} bytes (--max-request-mb)")
    return body


def decode_request(body: bytes, header_length: str | None):
    """``(json header, {input: array}, [(output, binary?)], binary_data_output)`` of an infer body
    (run on a decode thread: ``json_body.loads`` holds the interpreter only briefly at a time)."""
    if header_length is not None:
        text = header_length.strip()
        if not (text.isascii() and text.isdigit()) or int(text) > len(body):
            raise RequestError(f"Inference-Header-Content-Length must be an integer 0..{len(body)} "
                               f"(the body's size), got {header_length[:40]!r}")
        split = int(text)
        head, binary = memoryview(body)[:split], memoryview(body)[split:]
    else:
        head, binary = body, memoryview(b"")
    try:
        req = loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(f"request body is not valid JSON: {str(exc)[:300]}") from None
    if not isinstance(req, dict):
        raise RequestError(f"request body must be a JSON object with 'inputs', got {type(req).__name__}")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("request needs 'inputs': a non-empty list of {name, shape, datatype, data}")
    arrays, offset = {}, 0
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise RequestError(f"inputs[{i}] must be an object with a string 'name'")
        name = tensor["name"]
        where = f"input {name!r}"
        if name in arrays:
            raise RequestError(f"{where} is given twice")
        if not isinstance(tensor.get("datatype"), str):
            raise RequestError(f"{where}: 'datatype' (a string such as FP32) is missing")
        shape = check_shape(tensor.get("shape"), where)
        params = tensor.get("parameters") or {}
        if not isinstance(params, dict):
            raise RequestError(f"{where}: 'parameters' must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise RequestError(f"{where}: binary_data_size {size!r} runs past the {len(binary)} binary bytes "
                                   f"after the JSON header")
            arrays[name] = from_bytes(binary[offset:offset + size], tensor["datatype"], shape, where)
            offset += size
        elif "data" in tensor:
            arrays[name] = from_values(tensor["data"], tensor["datatype"], shape, where)
        else:
            raise RequestError(f"{where} has neither 'data' nor parameters.binary_data_size")
    if offset != len(binary):
        raise RequestError(f"the body has {len(binary)} binary bytes after the JSON header, the inputs use {offset}")
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError("request 'parameters' must be an object")
    requested = []
    for i, out in enumerate(req.get("outputs") or []):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise RequestError(f"outputs[{i}] must be an object with a string 'name'")
        out_params = out.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise RequestError(f"outputs[{i}]: 'parameters' must be an object")
        requested.append((out["name"], out_params.get("binary_data")))
    return req, arrays, requested, bool(params.get("binary_data_output", False))


def encode_response(model: str, req: dict, outputs: dict[str, np.ndarray], requested, binary_all: bool) -> Response:
    flags = dict(requested)
    entries, blobs = [], []
    for name, array in outputs.items():
        array = np.ascontiguousarray(array)
        entry = {"name": name, "datatype": datatype_of_array(array), "shape": list(array.shape)}
        binary = flags.get(name)
        if binary if binary is not None else binary_all:
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = json_values(array)
        entries.append(entry)
    result = {"model_name": model, "model_version": "1", "outputs": entries}
    if isinstance(req.get("id"), str):
        result["id"] = req["id"]
    head = json.dumps(result, allow_nan=False).encode()
    if not blobs:
        return Response(head, media_type="application/json")
    return Response(head + b"".join(blobs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(head))})


DECODE_THREADS = 2


def build_app(core: Core) -> FastAPI:
    app = FastAPI(title="fusegraph", docs_url=None, redoc_url=None, openapi_url=None)
    limit = core.limits.max_request_bytes
    budget = BodyBudget(max(BODY_BUDGET_REQUESTS * limit, 64 << 20))
    pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="fg-decode")
    decoding = asyncio.Semaphore(DECODE_THREADS)      # bodies decoded at once (the rest wait, read)
    core.on_close(lambda: pool.shutdown(wait=False, cancel_futures=True))

    async def off_loop(fn, *args):
        async with decoding:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return JSONResponse({"error": f"{request.method} {request.url.path}: {exc.detail}"}, exc.status_code)

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        return JSONResponse({"ready": core.ready}, 200 if core.ready else 503)

    @app.get("/v2")
    async def server_metadata():
        return {"name": "fusegraph", "version": FUSEGRAPH_VERSION, "extensions": ["binary_tensor_data", "model_repository"]}

    def _model(name: str, version: str = ""):
        model = core.model(name)
        core.check_version(model, version)
        return model

    async def guarded(fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            status, message = status_of(exc)
            return JSONResponse({"error": message}, status)

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def metadata(name: str, version: str = ""):
        return await guarded(lambda: _model(name, version).metadata())

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str = ""):
        return await guarded(lambda: JSONResponse({"name": name, "ready": _model(name, version).ready.is_set()}))

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str = ""):
        def config():
            model = _model(name, version)
            return {"name": model.name, "platform": model.platform,
                    "max_batch_size": model.settings.max_batch_size if model.batch_axis is not None else 0,
                    "input": [s.to_json() for s in model.inputs], "output": [s.to_json() for s in model.outputs],
                    "instance_group": [{"count": model.instance_count, "kind": "KIND_CPU"}]}
        return await guarded(config)

    @app.post("/v2/repository/index")
    async def repository_index():
        return [{"name": n, "version": "1", "state": "READY" if m.ready.is_set() else "UNAVAILABLE"}
                for n, m in core.models.items()]

    @app.get("/metrics")
    async def metrics():
        return Response(core.metrics.render(), media_type=core.metrics.content_type)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str = ""):
        t0 = time.perf_counter()
        label = name if name in core.models else "_unknown"
        core.metrics.inflight.labels(label).inc()
        held = [0]
        try:
            core.check_open(name)
            model = _model(name, version)
            body = await _read_body(request, limit, budget, held)
            encoding = request.headers.get("content-encoding", "identity").lower()
            if encoding != "identity":
                body = await off_loop(inflate, body, encoding, limit)
                budget.take(len(body))
                held[0] += len(body)
            req, arrays, requested, binary_all = await off_loop(decode_request, body,
                                                                 request.headers.get(HEADER))
            del body
            names = [n for n, _ in requested]
            if names:
                core.select(model, {s.name: None for s in model.outputs}, names)
            timeout = core.timeout(None)
            future = core.submit(name, arrays, timeout)
            del arrays
            try:
                outputs = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
            except asyncio.TimeoutError:
                future.cancel()          # still queued: dropped; running: its run stops at its deadline
                raise RequestError(f"model {name!r}: request timed out after {timeout:.3f} s", 504) from None
            response = await off_loop(encode_response, name, req, core.select(model, outputs, names), requested,
                                      binary_all)
            status = 200
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            status, message = status_of(exc)
            log.info("request refused", extra={"model": name, "protocol": "http", "code": status, "reason": message})
            response = JSONResponse({"error": message}, status)
        finally:
            budget.give(held[0])
            core.metrics.inflight.labels(label).dec()
        core.metrics.finished(label, "http", time.perf_counter() - t0, status)
        return response

    return app
