"""Who may talk to the engine from a browser: the Host allow-list (the DNS-rebinding defence llama-server's
peers and Jupyter use), the Origin policy with CORS, and the request body's declared size.

A page on a foreign site can make a browser send requests to 127.0.0.1; what it cannot forge is the
Host header (it names the attacker's domain after a rebinding) and the Origin header. So: a Host other
than loopback or the configured --host is refused, an Origin other than loopback, the configured host
or one given with --cors-origins is refused, and an allowed Origin is reflected in CORS headers.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from aiohttp import web

from contract.hosts import LOOPBACK, WILDCARD, host_name
from contract.hosts import is_ip as _is_ip
from contract.middleware import error_response
from engine.args import EngineArgs


class Policy:
    def __init__(self, opts: EngineArgs):
        configured = opts.host.strip().lower().strip("[]")
        self.hosts = set(LOOPBACK) | {configured}
        # Bound to every interface, the engine is reached by its addresses (a rebinding needs a name) and
        # by the machine's own name.
        self.any_ip = configured in WILDCARD
        if self.any_ip:
            self.hosts.add(socket.gethostname().lower())
        origins = [o.strip().rstrip("/").lower() for o in (opts.cors_origins or "").split(",") if o.strip()]
        self.any_origin = "*" in origins
        self.origins = set(origins)
        self.max_body = opts.body_limit << 20

    def host_ok(self, header: str) -> bool:
        name = host_name(header)
        return name in self.hosts or (self.any_ip and _is_ip(name))

    def origin_ok(self, origin: str) -> bool:
        o = origin.strip().rstrip("/").lower()
        if self.any_origin or o in self.origins:
            return True
        parts = urlsplit(o)
        if parts.scheme not in ("http", "https"):
            return False  # "null" (sandboxed frames, file:), extensions
        try:
            return (parts.hostname or "") in self.hosts
        except ValueError:
            return False


POLICY = web.AppKey("policy", Policy)


@web.middleware
async def guard_middleware(request: web.Request, handler):
    policy = request.app[POLICY]
    host = request.headers.get("Host")
    if host is not None and not policy.host_ok(host):
        return error_response(403, f"Host {host[:200]!r} is not allowed: use 127.0.0.1, localhost, [::1] or the "
                                   "--host the engine was started with")
    origin = request.headers.get("Origin")
    if origin is not None and not policy.origin_ok(origin):
        return error_response(403, f"Origin {origin[:200]!r} is not allowed (allow it with --cors-origins)")
    if request.method == "OPTIONS":  # a CORS preflight, answered for any path as llama-server does
        return web.Response(headers={"Access-Control-Allow-Methods": "GET, POST",
                                     "Access-Control-Allow-Headers": "*"})
    if request.content_length is not None and request.content_length > policy.max_body:
        response = error_response(413, f"request body of {request.content_length} bytes is larger than the limit "
                                       f"of {policy.max_body} bytes (--body-limit)")
        response.force_close()  # the body is not read
        return response
    return await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: an allowed Origin is reflected on every answer, streams and errors included."""
    origin = request.headers.get("Origin")
    if origin is not None and response.status != 403 and request.app[POLICY].origin_ok(origin):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Credentials"] = "true"
        response.headers["Vary"] = "Origin"


def install(app: web.Application, opts: EngineArgs) -> None:
    app[POLICY] = Policy(opts)
    app.on_response_prepare.append(cors_headers)
