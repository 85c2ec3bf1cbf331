"""Read timeouts for the HTTP server: a request's headers and its body must arrive in time.

uvicorn closes a connection that stays idle between requests (``timeout_keep_alive``), but
not one that opens and sends nothing, nor one that sends a request slowly (a few header bytes,
or a body that stalls): each holds a file descriptor, and enough of them a server (slowloris).
``timed_protocol(header_s, body_s)`` is uvicorn's httptools protocol with two more timers: from
the connection's opening, and from each new request's first byte, its headers must be complete
within ``header_s``; from then its body within ``body_s``. Past either the client gets a 408
(``{"error": ...}``) and the connection is closed; the request's handler, if it had started,
sees the client gone (``http_server`` answers that 408 too, to nobody). Nothing else of the
protocol changes.
"""
from __future__ import annotations

import json
import logging

log = logging.getLogger("fusegraph.serve")


def timed_protocol(header_s: float, body_s: float):
    """The protocol class for ``uvicorn.Config(http=...)`` with header / body read timeouts
    (it needs httptools, which ``uvicorn[standard]``, the ``serve`` extra, installs)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError as exc:
        from ..errors import ConfigError
        raise ConfigError(f"the server's read timeouts need httptools ({exc}): "
                          f"pip install 'fusegraph[serve]'") from None

    class TimedHttpToolsProtocol(HttpToolsProtocol):
        _read_timer = None
        _reading = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm("headers", header_s)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._reading != "headers":        # a new request on a kept-alive connection
                self._arm("headers", header_s)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm("body", body_s)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

        def _arm(self, what: str, seconds: float) -> None:
            self._disarm()
            self._reading = what
            self._read_timer = self.loop.call_later(seconds, self._expired, what, seconds)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer = self._reading = None

        def _expired(self, what: str, seconds: float) -> None:
            self._read_timer = None
            if self.transport is None or self.transport.is_closing():
                return
            message = f"the request's {what} did not arrive within {seconds:g} s"
            log.info("request read timed out", extra={"protocol": "http", "code": 408, "reason": message})
            if self.cycle is None or not self.cycle.response_started:
                body = json.dumps({"error": message}).encode()
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                     b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                                     + body)
            self.transport.close()

    return TimedHttpToolsProtocol
