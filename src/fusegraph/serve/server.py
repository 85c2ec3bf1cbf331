"""Running the server: HTTP (uvicorn, main thread) and gRPC (grpcio, its own threads) over one core.

``serve(path, ...)`` discovers and loads the models, opens both listeners on loopback by
default, logs one ``serving`` line (JSON, with the bound ports: port 0 picks a free one), and
blocks until SIGTERM or SIGINT. Then the drain: readiness turns false, both listeners stop
taking new requests (a request on an open connection gets a JSON 503), requests already
accepted finish (up to ``drain_s``; shortly before it ends, whatever still runs is stopped at
its next kernel and answered a JSON 503 "shutting down", ``Core.abort``), the batchers empty
their queues, the models are closed, and ``serve`` returns 0 (the process exits normally, no
run left on any thread). HTTP connections must send a request's headers within
``header_timeout_s`` and its body within ``body_timeout_s`` (``http_timeouts.py``).
"""
from __future__ import annotations

import logging
import math
import socket
import threading
import time
from pathlib import Path

import uvicorn

from .core import Core
from .grpc_server import start_grpc
from .http_server import build_app
from .http_timeouts import timed_protocol
from .logs import setup_logging
from .repository import discover
from .settings import ServerLimits

log = logging.getLogger("fusegraph.serve")


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, with SIGTERM also starting the gRPC side's drain, and without
    re-raising the signal after shutdown (so the drain can finish and the process exit 0)."""

    def __init__(self, config, on_exit):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:
            self.force_exit = sig == 2  # a second Ctrl-C: stop now
            return
        self.should_exit = True
        threading.Thread(target=self._on_exit, args=(sig,), daemon=True).start()


def _abort_margin(drain_s: float) -> float:
    """How long before the end of the drain window the runs still going are stopped."""
    return min(1.0, drain_s / 2)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8000, grpc_port: int | None = 8001,
          config: str | Path | None = None, limits: ServerLimits | None = None, log_level: str = "info") -> int:
    setup_logging(log_level)
    limits = limits or ServerLimits()
    t0 = time.perf_counter()
    core = Core(discover(path, config), limits)
    sock = _listen(host, port)
    grpc_server, bound_grpc = (None, None)
    if grpc_port is not None and grpc_port >= 0:
        grpc_server, bound_grpc = start_grpc(core, host, grpc_port)
    stopped = threading.Event()

    def on_exit(sig):
        core.shutting_down = True
        log.info("shutdown requested: draining", extra={"signal": int(sig)})
        # what still runs when the drain window closes is stopped and answered 503 a little
        # before uvicorn would cut its connection without an answer
        window = threading.Timer(max(0.0, limits.drain_s - _abort_margin(limits.drain_s)), core.abort)
        window.daemon = True
        window.start()
        if grpc_server is not None:
            grpc_server.stop(grace=limits.drain_s).wait()
        stopped.set()

    config_ = uvicorn.Config(build_app(core), log_level="warning", access_log=False, lifespan="off",
                             timeout_graceful_shutdown=math.ceil(limits.drain_s) + 2, timeout_keep_alive=5,
                             http=timed_protocol(limits.header_timeout_s, limits.body_timeout_s))
    server = _Uvicorn(config_, on_exit)
    log.info("serving", extra={"host": host, "http_port": sock.getsockname()[1], "grpc_port": bound_grpc,
                               "models": ",".join(core.models), "seconds": round(time.perf_counter() - t0, 3)})
    try:
        server.run(sockets=[sock])
    finally:
        if grpc_server is not None:
            if not stopped.wait(limits.drain_s + 1):
                grpc_server.stop(grace=0)
        core.close()
        sock.close()
        log.info("stopped")
    return 0
