"""Who may talk to the studio from a browser: the Host allow-list, Origin and content-type checks, CORS.

A web page can make the user's browser send requests to 127.0.0.1. Two defences stop it reading or
changing anything: the Host header must name this machine (a DNS-rebinding page sends its own host
name), and a request that changes state must be JSON from no foreign Origin (a cross-origin page can
send text/plain or form bodies without a preflight, never application/json). CORS is granted only to
origins the user configured.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

from contract.hosts import LOOPBACK, WILDCARD, host_name
from contract.hosts import is_ip as _is_ip

MUTATING = ("POST", "PUT", "PATCH", "DELETE")
CORS_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, X-Api-Key"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refuse = Callable[[int, str, str], web.StreamResponse]


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (a bare name, brackets allowed)."""
    name = host.strip().lower().strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    def __init__(self, host: str, origins: Iterable[str] = ()) -> None:
        configured = host.strip().lower().strip("[]")
        self.hosts = {*LOOPBACK, configured}
        # Listening on every address: any IP literal names this machine (rebinding needs a host name).
        self.any_ip = configured in WILDCARD
        self.origins = {o.rstrip("/") for o in origins}

    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        name = host_name(header)
        return name in self.hosts or is_loopback(name) or (self.any_ip and _is_ip(name))

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        """A configured origin, or the studio's own (same scheme-less host:port as the request's Host)."""
        if origin.rstrip("/") in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc.lower() == host_header.strip().lower()

    def cors_headers(self, origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Credentials": "true"}

    def middleware(self, refuse: Refuse):
        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            host = request.headers.get("Host")
            if not self.host_allowed(host):
                return refuse(403, "forbidden_host",
                              f"Host {host!r} is not this studio's; use 127.0.0.1, localhost or the configured host")
            origin = request.headers.get("Origin")
            if request.method == "OPTIONS":
                return self._preflight(request, origin, refuse)
            if origin is not None and not self.origin_allowed(origin, host or ""):
                if request.method in MUTATING:
                    return refuse(403, "forbidden_origin", f"requests from Origin {origin!r} are not allowed; "
                                  "configure it in api.cors_origins (or --cors-origin) to allow it")
            if request.method in MUTATING and _has_body(request) and request.content_type != "application/json":
                return refuse(415, "unsupported_media_type",
                              f"the body must be application/json, got {request.content_type or 'none'!r}")
            return await handler(request)

        return guard

    def _preflight(self, request: web.Request, origin: str | None, refuse: Refuse) -> web.StreamResponse:
        if origin is None or origin.rstrip("/") not in self.origins:
            return refuse(403, "forbidden_origin", f"no CORS grant for Origin {origin!r}")
        headers = {**self.cors_headers(origin), "Access-Control-Allow-Methods": CORS_METHODS,
                   "Access-Control-Allow-Headers": CORS_HEADERS, "Access-Control-Max-Age": "600"}
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        # Set as each response (streams included) is prepared, so a granted origin can read it.
        origin = request.headers.get("Origin")
        if origin is not None and origin.rstrip("/") in self.origins:
            response.headers.update(self.cors_headers(origin))


def _has_body(request: web.Request) -> bool:
    return bool(request.content_length) or request.headers.get("Transfer-Encoding", "").lower() == "chunked"
