"""The studio's REST API on aiohttp, and the /v1 proxy to the loaded engine.

`build_app(manager)` returns an Application so the TUI can serve it from its own event loop (give its
AppRunner `handler_cancellation=True`, as `lockstep serve` does, so a client that disconnects
mid-stream stops the proxied generation at once).
Every error is `{"error": {"code", "type", "message"}}` with its HTTP status.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import ValidationError

from contract import middleware
from settings import EXACT_MODES, LoadRequest, SettingsConflict, SettingsError
from studio.errors import StudioError, validation_message
from studio.guard import Guard
from studio.manager import LoadManager
from studio.openai_front import RequestRecord, load_on_demand, model_list, prepare_body
from studio.proxy import forward, upstream_path
from studio.pull_api import stream_pull
from studio.settings_api import check_load_args, check_settings_patch

log = logging.getLogger("lockstep.api")

MANAGER = web.AppKey("manager", LoadManager)
CLIENT = web.AppKey("client", aiohttp.ClientSession)
KEYED = web.AppKey("keyed", bool)  # started with an api key: callers are the user, not any web page
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MAX_BODY = 64 * 1024 * 1024  # long prompts go through the proxy



def error_response(status: int, type_: str, message: str, **extra: Any) -> web.Response:
    """contract.middleware's answer, in the argument order the guard and the proxy call it with."""
    return middleware.error_response(status, message, type_, extra)


def _known(exc: Exception) -> web.Response | None:
    if isinstance(exc, StudioError):
        return web.json_response(exc.body(), status=exc.status)
    if isinstance(exc, SettingsConflict):
        return error_response(409, "settings_conflict", exc.message)
    if isinstance(exc, SettingsError):
        return error_response(409, "settings_not_writable", exc.message)
    if isinstance(exc, ValidationError):
        return error_response(400, "invalid_request_error", validation_message(exc))
    if isinstance(exc, HttpProcessingError | RequestPayloadError):  # e.g. a body that is not what its Content-Encoding says
        reason = str(exc).strip().splitlines()
        return error_response(400, "invalid_request_error", f"the body cannot be read: {' '.join(reason)[:200]}")
    return None


errors_middleware = middleware.errors_middleware(log, _known)


class _BodyErrorsInOneLine(logging.Filter):
    """aiohttp logs a traceback when it drains a body the handler already refused (bad Content-Encoding)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError | RequestPayloadError):
            record.msg, record.args, record.exc_info = "bad HTTP request body: %s", (" ".join(str(exc).split()),), None
        return True


_ONE_LINE = _BodyErrorsInOneLine()


def auth_middleware(api_key: str | None):
    return middleware.auth_middleware(lambda request: api_key, "invalid or missing API key")


async def _json_body(request: web.Request) -> Any:
    try:
        body = await request.json()
        # A lone surrogate ("\ud800") is valid JSON but no file name, argv or settings file can hold it.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise StudioError(400, "invalid_request_error", f"the body is not valid JSON: {exc}") from exc
    except UnicodeEncodeError as exc:
        raise StudioError(400, "invalid_request_error", "the body holds a lone surrogate (\\u" +
                          f"{ord(exc.object[exc.start]):04x}), which is not text") from exc
    return body


def _manager(request: web.Request) -> LoadManager:
    return request.app[MANAGER]


async def models(request: web.Request) -> web.Response:
    catalog = _manager(request).catalog
    found = await asyncio.to_thread(catalog.scan)
    return web.json_response({"models": [m.model_dump() for m in found],
                              "folders": [str(f) for f in catalog.roots()], "problems": catalog.problems})


async def pull_model(request: web.Request) -> web.StreamResponse:
    return await stream_pull(request, _manager(request), await _json_body(request))


async def load(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise StudioError(400, "invalid_request_error", "the body must be a JSON object")
    request_ = LoadRequest.model_validate(body)
    check_load_args(request_, keyed=request.app[KEYED])
    # Shielded: a client that stops waiting does not abandon a load half way (status shows how it ends).
    return web.json_response(await asyncio.shield(_manager(request).load(request_)))


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
    await asyncio.to_thread(manager.store.update, {"exact_concurrency": value})
    return web.json_response(manager.exact_view())


def _settings_view(manager: LoadManager) -> web.Response:
    store = manager.store
    body = {"settings": store.settings.model_dump(), "path": str(store.path), "version": store.version,
            "problems": [p.message() for p in store.problems]}
    return web.json_response(body, headers={"ETag": f'"{store.version}"'})


async def get_settings(request: web.Request) -> web.Response:
    manager = _manager(request)
    await asyncio.to_thread(manager.store.refresh)  # another studio may share the file
    return _settings_view(manager)


async def put_settings(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise StudioError(400, "invalid_request_error", "the body must be a JSON object of settings")
    manager = _manager(request)
    check_settings_patch(body, manager.store.settings, keyed=request.app[KEYED])
    expected = request.headers.get("If-Match", "").strip().strip('"') or None
    # Under the store's file lock, merged into what is on disk; a ValidationError becomes a 400 and writes nothing.
    await asyncio.to_thread(manager.store.update, body, expected)
    return _settings_view(manager)


async def logs(request: web.Request) -> web.Response:
    try:
        tail = int(request.query.get("tail", "65536"))
    except ValueError as exc:
        raise StudioError(400, "invalid_request_error", "tail must be a number of bytes") from exc
    # up to 16 MiB of each attempt's log: read off the event loop
    return web.json_response(await asyncio.to_thread(_manager(request).logs, max(0, min(tail, 16 * 1024 * 1024))))


async def v1_models(request: web.Request) -> web.Response:
    manager = _manager(request)
    return web.json_response(model_list(manager, await asyncio.to_thread(manager.catalog.scan)))


async def proxy(request: web.Request) -> web.StreamResponse:
    path = upstream_path(request.match_info["tail"])
    if path is None:
        raise StudioError(404, "not_found_error", f"{request.path!r} is not an API path the studio forwards")
    manager = _manager(request)
    raw = await request.read()
    await load_on_demand(manager, path, raw)
    child = await manager.engine()
    body = prepare_body(manager, path, raw)
    record = RequestRecord(path)
    status: int | str = "cancelled (the client left)"
    try:
        response = await forward(request, path, child, request.app[CLIENT], body, error_response, tap=record.feed)
        status = response.status
        return response
    finally:
        manager.log.info(record.line(status))


def build_app(manager: LoadManager, *, api_key: str | None = None, host: str | None = None,
              cors_origins: list[str] | None = None, stop_engine_on_cleanup: bool = True) -> web.Application:
    """The API over `manager`; `api_key`, `host` (for the Host check) and `cors_origins` default to the
    effective settings' (no key: open to this machine only through the Host and Origin checks)."""
    api = manager.effective_settings().api
    key = api_key if api_key is not None else api.api_key
    guard = Guard(host if host is not None else api.host, cors_origins if cors_origins is not None else api.cors_origins)
    app = web.Application(middlewares=[errors_middleware, guard.middleware(error_response), auth_middleware(key)],
                          client_max_size=MAX_BODY)
    app.on_response_prepare.append(guard.on_prepare)
    logging.getLogger("aiohttp.server").addFilter(_ONE_LINE)  # a set: adding it again is a no-op
    app[MANAGER] = manager
    app[KEYED] = bool(key)
    app.router.add_get("/api/models", models)
    app.router.add_post("/api/models/pull", pull_model)
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
