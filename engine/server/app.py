"""The aiohttp application: routes, and the middlewares every endpoint shares (auth, loading, errors)."""

from __future__ import annotations

import logging

from aiohttp import web

from contract import middleware
from contract.middleware import error_response
from engine.server import completion, guard, infill, native, openai_api, responses_api, slot_files
from engine.server.errors import ApiError
from engine.server.state import STATE, EngineState, state_of

log = logging.getLogger("engine.server")

OPEN_PATHS = ("/health", "/v1/health")  # answered without the API key, as llama-server does


def _known(e: Exception) -> web.Response | None:
    return e.response() if isinstance(e, ApiError) else None


errors_middleware = middleware.errors_middleware(log, _known)
# llama-server's answer, and its open health paths
auth_middleware = middleware.auth_middleware(lambda request: state_of(request).opts.api_key, "Invalid API Key", OPEN_PATHS)


@web.middleware
async def loading_middleware(request: web.Request, handler):
    state = state_of(request)
    if state.stopping:
        return error_response(503, "server is shutting down")
    if not state.ready and not state.sleeping and request.match_info.route.resource is not None:
        return error_response(503, "Loading model")
    return await handler(request)


def build_app(state: EngineState) -> web.Application:
    # last: neither a refused request nor one arriving during shutdown wakes the model
    sleeper = [state.sleeper.middleware] if state.sleeper is not None else []
    app = web.Application(middlewares=[errors_middleware, guard.guard_middleware, auth_middleware,
                                       loading_middleware, *sleeper],
                          client_max_size=state.opts.body_limit << 20)
    app[STATE] = state
    guard.install(app, state.opts)
    r = app.router
    for path in OPEN_PATHS:
        r.add_get(path, native.health)
    r.add_get("/props", native.props)
    r.add_get("/slots", native.slots)
    r.add_get("/metrics", native.metrics)
    for path in ("/completion", "/completions"):
        r.add_post(path, completion.completion)
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        r.add_post(path, native.chat_token_count)
    for path in ("/infill",):
        r.add_post(path, infill.infill)
    for path in ("/v1/responses", "/responses"):
        r.add_post(path, responses_api.responses)
        r.add_post(path + "/input_tokens", responses_api.input_tokens)
    r.add_post("/slots/{id_slot}", slot_files.slot_action)
    r.add_post("/tokenize", native.tokenize)
    r.add_post("/detokenize", native.detokenize)
    r.add_post("/apply-template", native.apply_template)
    for path in ("/v1/models", "/models"):
        r.add_get(path, openai_api.models)
    r.add_get("/v1/models/{model:.+}", openai_api.model)
    r.add_post("/v1/completions", openai_api.completions)
    for path in ("/v1/chat/completions", "/chat/completions"):
        r.add_post(path, openai_api.chat_completions)
    return app
