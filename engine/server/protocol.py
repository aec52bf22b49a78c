"""The HTTP connection layer under the app: a connection limit, and aiohttp's parser-level errors (bad
request lines, headers, chunking) in the JSON error shape with one log line instead of plain text and
a traceback per request.

Slow clients: aiohttp's keep-alive timer also closes a connection whose request headers have not
arrived (it runs from the connection's start); the engine sets it to --timeout. The body's own
timeout is applied where it is read (params.read_body).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from contract.middleware import error_body, error_response
from engine.server.params import one_line

log = logging.getLogger("engine.server")


def _busy_bytes(limit: int) -> bytes:
    body = json.dumps(error_body(503, f"too many connections (at most {limit}, --max-connections)")).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class _Handler(RequestHandler):
    def log_exception(self, *args, **kw):
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError | RequestPayloadError):  # the rest of a body that was refused
            log.warning("bad HTTP request body: %s", one_line(getattr(exc, "message", exc)))
            return
        super().log_exception(*args, **kw)

    def handle_error(self, request, status=500, exc=None, message=None):
        text = one_line(message or exc or "malformed HTTP request")
        log.warning("bad HTTP request from %s: %s", request.remote, text)
        if request.writer.output_size > 0:  # a response started: the connection can only be cut
            raise ConnectionError("response already started")
        response = error_response(status, text)
        response.force_close()
        return response


class GuardedServer(web.Server):
    max_connections = 256

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.max_connections:
            transport.write(_busy_bytes(self.max_connections))
            transport.close()


class GuardedRunner(web.AppRunner):
    def __init__(self, app: web.Application, max_connections: int, **kwargs):
        super().__init__(app, **kwargs)
        self.max_connections = max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside the app; only its class is swapped, to override two methods
        server.__class__ = GuardedServer
        server.max_connections = self.max_connections
        return server
