"""llama-server's own endpoints: /health, /props, /slots, /metrics, /tokenize, /detokenize, /apply-template and
the chat token count (/completion is in engine.server.completion)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from aiohttp import web

from engine import metrics as prom
from engine.server.chat_render import build_prompt
from engine.server.completion import json_bias
from engine.server.errors import ApiError, bad_request
from engine.server.offload import json_list
from engine.server.params import Fields, read_json, token_ids
from engine.server.pieces import piece_json
from engine.server.state import LLAMA_BUILD_INFO, EngineState, state_of

SLOTS_WAIT_S = 0.02
# A million tokens' list costs the GIL about 0.1 s to build and free, during which nothing else runs: the
# bound on one request's stall of the event loop.
MAX_TOKENIZE_CHARS = 1 << 20


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def generation_defaults(state: EngineState) -> dict:
    params = asdict(state.defaults)
    params.update(seed=state.opts.seed, n_predict=getattr(state.opts, "n_predict", -1), stop=[], n_probs=0,
                  cache_prompt=True, logit_bias=[])
    return {"n_ctx": state.scheduler.n_ctx_seq, "params": params}


async def props(request: web.Request) -> web.Response:
    state = state_of(request)
    if state.sleeping:
        return web.json_response({**state.sleeper.asleep["props"], "is_sleeping": True})
    return web.json_response(props_body(state))


def props_body(state: EngineState) -> dict:
    tok = state.tokenizer
    opts = state.opts
    return {
        "default_generation_settings": generation_defaults(state),
        "n_ctx": state.n_ctx,
        "n_ctx_seq": state.scheduler.n_ctx_seq,
        "total_slots": opts.parallel,
        "kv_unified": opts.kv_unified,
        "cache_type_k": opts.cache_type_k,
        "cache_type_v": opts.cache_type_v,
        "model_alias": state.alias,
        "model_path": str(state.loaded.path),
        "chat_template": tok.template.source,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "modalities": {"vision": False, "audio": False},
        "build_info": LLAMA_BUILD_INFO,
        "lockstep_build": state.build_info,
        "is_sleeping": False,
        "exact_concurrency": state.exact.as_dict(),
        "n_threads": opts.threads,
        "cpu_threads": state.cpu_threads,
        "tensor_parallel": state.parallel,
        "load_seconds": state.load_seconds,
    }


async def slots(request: web.Request) -> web.Response:
    """Fresh rows when the compute thread publishes them soon (between two steps), else the last
    ones: the event loop never waits for a step."""
    state = state_of(request)
    if not getattr(state.opts, "slots_endpoint", True):
        raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`")
    if state.sleeping:
        return web.json_response(state.sleeper.asleep["slots"])
    scheduler = state.scheduler
    version = scheduler.want_slots()
    deadline = time.monotonic() + SLOTS_WAIT_S
    while scheduler.slots_version == version and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    return web.json_response(slot_rows(state, scheduler.slots()))


def slot_rows(state: EngineState, rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:  # a slot's sampling parameters only with --verbose, as llama-server's debug
        row = dict(row)
        params = row.pop("params", {})
        if getattr(state.opts, "verbose", False):
            row["params"] = {**params, "logit_bias": json_bias(params.get("logit_bias", ()))}
        out.append(row)
    return out


async def metrics(request: web.Request) -> web.Response:
    state = state_of(request)
    if not state.opts.metrics:
        raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
    return web.Response(text=prom.render(state.stats(), state.served, state.served.window()),
                        content_type="text/plain", charset="utf-8",
                        headers={"Process-Start-Time-Unix": str(int(state.started))})


async def tokenize(request: web.Request) -> web.Response:
    state = state_of(request)
    f = Fields(await read_json(request))
    content = f.str("content")
    if content is None:
        raise bad_request("'content' is required")
    if len(content) > MAX_TOKENIZE_CHARS:
        raise bad_request(f"'content' has {len(content)} characters; /tokenize takes at most {MAX_TOKENIZE_CHARS} "
                          "at once (split the text)")
    tok = state.tokenizer
    with_pieces = f.bool("with_pieces", False)

    def work() -> str:
        ids = tok.encode(content, add_special=f.bool("add_special", False))
        return json_list([{"id": i, "piece": piece_json(tok, i)} for i in ids] if with_pieces else ids)

    tokens = await state.workers.run(work, size=len(content))
    return web.Response(text='{"tokens": ' + tokens + "}", content_type="application/json")


async def detokenize(request: web.Request) -> web.Response:
    state = state_of(request)
    f = Fields(await read_json(request))
    value = f.raw("tokens", [])
    if not isinstance(value, list):
        raise bad_request("'tokens' must be an array of token ids")
    ids = token_ids(value, state.tokenizer.vocab_size, "tokens")
    return web.json_response({"content": await state.workers.run(state.tokenizer.decode, ids, False, size=len(ids))})


async def apply_template(request: web.Request) -> web.Response:
    state = state_of(request)
    f = Fields(await read_json(request))
    return web.json_response({"prompt": (await build_prompt(state, f, encode=False)).text})


async def chat_token_count(request: web.Request) -> web.Response:
    """llama-server's /chat/completions/input_tokens: the rendered prompt's length, nothing generated."""
    state = state_of(request)
    f = Fields(await read_json(request))
    return web.json_response({"input_tokens": len((await build_prompt(state, f)).ids)})
