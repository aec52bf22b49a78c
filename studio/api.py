"""The studio's REST API on aiohttp, and the /v1 proxy to the loaded engine.

`build_app(manager)` returns an Application so the TUI can serve it from its own event loop (give its
AppRunner `handler_cancellation=True`, as `lockstep serve` does, so a client that disconnects
mid-stream stops the proxied generation at once).
Every error is `{"error": {"code", "type", "message"}}` with its HTTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from settings import EXACT_MODES, LoadRequest
from studio.errors import StudioError
from studio.manager import LoadManager
from studio.openai_front import model_list, prepare_body

log = logging.getLogger("lockstep.api")

MANAGER = web.AppKey("manager", LoadManager)
CLIENT = web.AppKey("client", aiohttp.ClientSession)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MAX_BODY = 64 * 1024 * 1024  # long prompts go through the proxy
# Headers that belong to one hop, not to the request or response being relayed.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, type_: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"code": status, "type": type_, "message": message, **extra}},
                             status=status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except StudioError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except ValidationError as exc:
        return error_response(400, "invalid_request_error", _validation_message(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error"}
        return error_response(exc.status, kind.get(exc.status, "invalid_request_error"), exc.reason)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # a bug or an unusable machine still answers in the API's error shape
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "server_error", f"internal error: {type(exc).__name__}: {exc}")


def auth_middleware(api_key: str | None):
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if api_key:
            given = request.headers.get("X-Api-Key", "")
            auth = request.headers.get("Authorization", "")
            if auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not secrets.compare_digest(given.encode(), api_key.encode()):
                return error_response(401, "authentication_error", "invalid or missing API key")
        return await handler(request)

    return check


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StudioError(400, "invalid_request_error", f"the body is not valid JSON: {exc}") from exc


def _manager(request: web.Request) -> LoadManager:
    return request.app[MANAGER]


async def models(request: web.Request) -> web.Response:
    catalog = _manager(request).catalog
    return web.json_response({"models": [m.model_dump() for m in catalog.scan()],
                              "folders": [str(f) for f in catalog.roots()]})


async def load(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise StudioError(400, "invalid_request_error", "the body must be a JSON object")
    # Shielded: a client that stops waiting does not abandon a load half way (status shows how it ends).
    return web.json_response(await asyncio.shield(_manager(request).load(LoadRequest.model_validate(body))))


async def unload(request: web.Request) -> web.Response:
    return web.json_response(await _manager(request).unload())


async def status(request: web.Request) -> web.Response:
    return web.json_response(await _manager(request).status())


async def get_exact(request: web.Request) -> web.Response:
    return web.json_response(_manager(request).exact_view())


async def put_exact(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict) or "exact_concurrency" not in body:
        raise StudioError(400, "invalid_request_error", 'expected {"exact_concurrency": "auto"|"off"|"on"|null}')
    value = body["exact_concurrency"]
    if value is not None and value not in EXACT_MODES:
        raise StudioError(400, "invalid_request_error",
                          f"exact_concurrency must be one of {', '.join(EXACT_MODES)} or null, got {value!r}")
    manager = _manager(request)
    manager.store.update({"exact_concurrency": value})
    return web.json_response(manager.exact_view())


def _settings_view(manager: LoadManager) -> dict[str, Any]:
    return {
        "settings": manager.store.settings.model_dump(),
        "path": str(manager.store.path),
        "problems": [p.message() for p in manager.store.problems],
    }


async def get_settings(request: web.Request) -> web.Response:
    return web.json_response(_settings_view(_manager(request)))


async def put_settings(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise StudioError(400, "invalid_request_error", "the body must be a JSON object of settings")
    manager = _manager(request)
    manager.store.update(body)  # a ValidationError becomes a 400 and writes nothing
    return web.json_response(_settings_view(manager))


async def logs(request: web.Request) -> web.Response:
    try:
        tail = int(request.query.get("tail", "65536"))
    except ValueError as exc:
        raise StudioError(400, "invalid_request_error", "tail must be a number of bytes") from exc
    return web.json_response(_manager(request).logs(max(0, min(tail, 16 * 1024 * 1024))))


async def v1_models(request: web.Request) -> web.Response:
    return web.json_response(model_list(_manager(request)))


async def proxy(request: web.Request) -> web.StreamResponse:
    manager = _manager(request)
    child = await manager.engine()
    # The studio answers for origins (the engine would judge the studio's own clients by its own policy).
    dropped = _HOP | {"authorization", "x-api-key", "origin"}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
    headers.update(child.auth_headers)
    body = prepare_body(manager, request.path, await request.read())
    session = request.app[CLIENT]
    # No total timeout: a long generation streams for as long as it streams.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    response: web.StreamResponse | None = None
    try:
        async with session.request(request.method, child.base_url + request.path_qs, headers=headers,
                                   data=body, timeout=timeout) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        if response is not None and response.prepared:
            await _end_cut_stream(response, exc)
            return response
        return error_response(502, "engine_unreachable", f"the engine did not answer: {exc}")


async def _end_cut_stream(response: web.StreamResponse, exc: Exception) -> None:
    """The engine went away mid-answer. A cut stream must not read as a complete one: an event stream ends
    with an error event (OpenAI clients raise on it); any other body is left cut short."""
    if not response.content_type.startswith("text/event-stream"):
        return
    event = {"error": {"code": 502, "type": "engine_unreachable",
                       "message": f"the engine stopped mid-answer: {exc}"}}
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client may be gone as well
        await response.write(b"\n\ndata: " + json.dumps(event).encode() + b"\n\n")
        await response.write_eof()


def build_app(manager: LoadManager, *, api_key: str | None = None, stop_engine_on_cleanup: bool = True
              ) -> web.Application:
    """The API over `manager`; `api_key` defaults to the effective settings' api key (none: open)."""
    key = api_key if api_key is not None else manager.effective_settings().api.api_key
    app = web.Application(middlewares=[errors_middleware, auth_middleware(key)], client_max_size=MAX_BODY)
    app[MANAGER] = manager
    app.router.add_get("/api/models", models)
    app.router.add_post("/api/load", load)
    app.router.add_post("/api/unload", unload)
    app.router.add_get("/api/status", status)
    app.router.add_get("/api/settings/exact-concurrency", get_exact)
    app.router.add_put("/api/settings/exact-concurrency", put_exact)
    app.router.add_get("/api/settings", get_settings)
    app.router.add_put("/api/settings", put_settings)
    app.router.add_get("/api/logs", logs)
    app.router.add_get("/v1/models", v1_models)
    app.router.add_route("*", "/v1/{tail:.*}", proxy)

    async def client_session(app: web.Application):
        app[CLIENT] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app[CLIENT].close()
        if stop_engine_on_cleanup:
            await manager.shutdown()

    app.cleanup_ctx.append(client_session)
    return app
