"""``fusegraph.serve``: a KServe v2 / Triton-protocol inference server for fusegraph models.

    from fusegraph.serve import serve
    serve("REPO_DIR", port=8000, grpc_port=8001)      # blocks until SIGTERM, then drains

Files: ``settings`` (per-model TOML keys), ``repository`` (which models), ``model`` (instances
and batch-size variants), ``batcher`` (dynamic batching), ``tensors`` (protocol tensors and
request checks), ``core`` (one infer path), ``http_server`` / ``grpc_server`` (front ends),
``json_body`` (request JSON decoded in short slices), ``http_timeouts`` (header / body read
timeouts), ``metrics``, ``logs``, ``server`` (running and draining), ``ray`` (Ray Serve / Ray Data).
The server needs the ``serve`` extra (fastapi, uvicorn, grpcio, tritonclient, prometheus-client);
importing this package alone needs none of them.
"""
from __future__ import annotations

__all__ = ["serve"]


def serve(*args, **kwargs) -> int:
    from .server import serve as _serve
    return _serve(*args, **kwargs)
