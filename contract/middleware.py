"""The HTTP answers both servers give in one shape: the error body, the catch-all error middleware, and
the bearer-key check.

Every error is `{"error": {"code", "type", "message", ...}}` with its HTTP status, as llama-server and
OpenAI clients expect. The engine and the studio differ only in which of their own exceptions they know
(`translate`) and in which paths they leave open; the rest is written once here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from contract.auth import presented_key, same_key

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Translate = Callable[[Exception], web.StreamResponse | None]


def error_type(status: int) -> str:
    return TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(status: int, message: str, type_: str | None = None, extra: dict | None = None) -> dict:
    return {"error": {"code": status, "type": type_ or error_type(status), "message": message, **(extra or {})}}


def error_response(status: int, message: str, type_: str | None = None, extra: dict | None = None) -> web.Response:
    return web.json_response(error_body(status, message, type_, extra), status=status)


def _http_message(e: web.HTTPException) -> str:
    """aiohttp's own text where it says more than '404: Not Found' (413 names the limit), else the reason."""
    return e.text if e.text and e.text not in (e.reason, f"{e.status}: {e.reason}") else e.reason


def errors_middleware(log: logging.Logger, translate: Translate = lambda e: None):
    """Every failure answers in the error shape: what `translate` knows of the server's own exceptions,
    the router's 404/405 and aiohttp's 413, and anything else as a 500 that is logged with its traceback."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return error_response(e.status, _http_message(e))
        except Exception as e:
            answer = translate(e)
            if answer is not None:
                return answer
            log.exception("%s %s failed", request.method, request.path)
            return error_response(500, f"internal error: {type(e).__name__}: {e}")

    return errors


def auth_middleware(key_of: Callable[[web.Request], str | None], message: str, open_paths: Iterable[str] = ()):
    """With a key set, a request must present it (`Authorization: Bearer`, or `X-Api-Key`), except on
    `open_paths` and CORS preflights; `key_of` reads the key per request so a server may hold it in its state."""
    open_paths = frozenset(open_paths)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = key_of(request)
        if key and request.path not in open_paths and request.method != "OPTIONS":
            if not same_key(presented_key(request.headers), key):
                return error_response(401, message)
        return await handler(request)

    return auth
