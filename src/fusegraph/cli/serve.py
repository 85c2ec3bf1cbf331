"""``fusegraph serve MODEL.fgm|MODEL.onnx|REPO_DIR``: the KServe v2 / Triton-protocol server.

Only the argument parsing lives here; the server is ``fusegraph.serve.server.serve``.
``add_serve_parser(sub)`` registers the subcommand on the main parser's subparsers.
"""
from __future__ import annotations

import argparse
import sys


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -2
    if not -1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0..65535 (0: any free port, -1: off), got {text!r}")
    return n


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 3600], got {text!r}")
    return value


def serve_command(args) -> int:
    try:
        from ..serve.server import serve
        from ..serve.settings import ServerLimits
    except ModuleNotFoundError as exc:
        from ..errors import ConfigError
        raise ConfigError(f"fusegraph serve needs the 'serve' extra ({exc.name} is missing): "
                          f"pip install 'fusegraph[serve]'") from None
    limits = ServerLimits(max_request_bytes=args.max_request_mb << 20, timeout_s=args.timeout, drain_s=args.drain,
                          header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout)
    try:
        return serve(args.model, host=args.host, port=args.port, grpc_port=args.grpc_port, config=args.config,
                     limits=limits, log_level=args.log_level)
    except OSError as exc:  # a port in use, an address that is not this machine's
        print(f"fusegraph serve: error: cannot listen on {args.host}: {exc}", file=sys.stderr)
        return 2


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve models over KServe v2 HTTP and gRPC (Triton protocol)")
    p.add_argument("model", help="an .fgm, an .onnx, or a model repository folder REPO/<name>/model.fgm")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--port", type=_port, default=8000, help="HTTP port (default 8000; 0: any free port)")
    p.add_argument("--grpc-port", type=_port, default=8001, help="gRPC port (default 8001; 0: any; -1: off)")
    p.add_argument("--config", metavar="cfg.toml", help="serving + fg.Config keys (defaults for a repository)")
    p.add_argument("--max-request-mb", type=int, default=64, help="largest request body in MiB (default 64)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take (default 30)")
    p.add_argument("--drain", type=float, default=10.0, help="seconds to finish requests on SIGTERM (default 10)")
    p.add_argument("--header-timeout", type=_seconds, default=10.0,
                   help="seconds a client has to send a request's headers (default 10; then 408)")
    p.add_argument("--body-timeout", type=_seconds, default=60.0,
                   help="seconds a client has to send a request's body (default 60; then 408)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=serve_command)
