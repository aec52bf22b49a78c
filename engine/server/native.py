"""llama-server's own endpoints: /health, /props, /slots, /metrics, /completion, /tokenize, /detokenize,
/apply-template."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from aiohttp import web

from engine import metrics as prom
from engine.requests import Request
from engine.server.chat import check_messages, render
from engine.server.errors import ApiError, bad_request
from engine.server.generation import Choice, Generation, TokenOut
from engine.server.offload import json_list
from engine.server.params import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    Fields,
    max_tokens,
    prompt_tokens,
    read_json,
    reject_unsupported,
    sampling,
    stop_strings,
    token_ids,
)
from engine.server.pieces import piece_json, token_bytes
from engine.server.run import EventStream, failure, generation
from engine.server.state import EngineState, state_of

SLOTS_WAIT_S = 0.02
# A million tokens' list costs the GIL about 0.1 s to build and free, during which nothing else runs: the
# bound on one request's stall of the event loop.
MAX_TOKENIZE_CHARS = 1 << 20


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def generation_defaults(state: EngineState) -> dict:
    params = asdict(state.defaults)
    params.update(seed=state.opts.seed, n_predict=-1, stop=[], n_probs=0, cache_prompt=True)
    return {"n_ctx": state.scheduler.n_ctx_seq, "params": params}


async def props(request: web.Request) -> web.Response:
    state = state_of(request)
    tok = state.tokenizer
    opts = state.opts
    return web.json_response({
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
        "build_info": state.build_info,
        "exact_concurrency": state.exact.as_dict(),
    })


async def slots(request: web.Request) -> web.Response:
    """Fresh rows when the compute thread publishes them soon (between two steps), else the last
    ones: the event loop never waits for a step."""
    scheduler = state_of(request).scheduler
    version = scheduler.want_slots()
    deadline = time.monotonic() + SLOTS_WAIT_S
    while scheduler.slots_version == version and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    return web.json_response(scheduler.slots())


async def metrics(request: web.Request) -> web.Response:
    state = state_of(request)
    if not state.opts.metrics:
        raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
    return web.Response(text=prom.render(state.scheduler.stats(), state.served),
                        content_type="text/plain", charset="utf-8")


def _prob_entry(tok, token_id: int, logprob: float) -> dict:
    return {"id": token_id, "token": tok.piece(token_id), "bytes": list(token_bytes(tok, token_id)),
            "logprob": logprob}


def _probs(tok, tokens: list[TokenOut]) -> list[dict]:
    out = []
    for t in tokens:
        entry = _prob_entry(tok, t.id, t.logprob)
        entry["top_logprobs"] = [_prob_entry(tok, i, lp) for i, lp in t.top or []]
        out.append(entry)
    return out


def _summary(state: EngineState, gen: Generation, choice: Choice, body: dict, stream: bool) -> dict:
    req, done = gen.request, choice.done
    timings = dict(done.timings) if done and done.timings else {}
    timings["cache_n"] = done.cached_tokens if done else 0
    out = {
        "index": choice.index,
        "content": "" if stream else choice.text,
        "tokens": [] if stream else [t.id for t in choice.tokens],
        "id_slot": req.id_slot,
        "stop": True,
        "model": state.alias,
        "tokens_predicted": len(choice.tokens),
        "tokens_evaluated": len(req.prompt),
        "tokens_cached": done.cached_tokens if done else 0,
        "generation_settings": {**asdict(req.params), "n_predict": req.max_tokens, "stop": body["stop"],
                                "n_probs": max(req.logprobs, 0), "cache_prompt": req.cache_prompt,
                                "stream": stream},
        "prompt": body["prompt_text"],
        "has_new_line": "\n" in choice.text,
        "truncated": False,
        "stop_type": choice.stop_type,
        "stopping_word": choice.stopping_word,
        "timings": timings,
        "seed": req.params.seed,
        "preempt": choice.preempt,
    }
    if req.logprobs > 0 and not stream:
        out["completion_probabilities"] = _probs(state.tokenizer, choice.tokens)
    return out


async def completion(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    f = Fields(await read_json(request))
    reject_unsupported(f)
    tok = state.tokenizer
    prompt = await prompt_tokens(f.raw("prompt"), state)
    stops = stop_strings(f)
    n_probs = f.int("n_probs", 0, 0, MAX_TOP_LOGPROBS)
    req = Request(
        prompt=prompt,
        params=sampling(f, state.defaults, state.opts.seed),
        max_tokens=max_tokens(f, "n_predict", "max_tokens"),
        logprobs=n_probs if n_probs > 0 else -1,
        cache_prompt=f.bool("cache_prompt", True),
        id_slot=f.int("id_slot", -1, -1, state.opts.parallel - 1),
        n=f.int("n", 1, 1, MAX_N),
    )
    stream = f.bool("stream", False)
    if stream and req.n > 1:
        raise bad_request("'n' > 1 is not supported with 'stream' on /completion; use /v1/completions")
    prompt_text = f.raw("prompt") if isinstance(f.raw("prompt"), str) else \
        await state.workers.run(tok.decode, prompt, False, size=len(prompt))
    body = {"stop": stops, "prompt_text": prompt_text}
    async with generation(state, req, stops) as gen:
        if not stream:
            async for _ in gen.deltas():
                pass
            if err := failure(gen):
                raise err
            if req.n == 1:
                return web.json_response(_summary(state, gen, gen.choices[0], body, stream=False))
            # a Lockstep extension: n completions of one prompt, as a list in index order
            return web.json_response([_summary(state, gen, c, body, stream=False) for c in gen.choices])
        sse = EventStream(request)
        await sse.open()
        async with sse.failing_as_event():
            async for d in gen.deltas():
                if d.text or d.tokens:
                    chunk = {"index": 0, "content": d.text, "tokens": [t.id for t in d.tokens], "stop": False,
                             "id_slot": req.id_slot, "tokens_predicted": len(gen.choices[0].tokens),
                             "tokens_evaluated": len(prompt)}
                    if req.logprobs > 0:
                        chunk["completion_probabilities"] = _probs(tok, d.tokens)
                    await sse.send(chunk)
            if err := failure(gen):
                await sse.error(err)
            else:
                await sse.send(_summary(state, gen, gen.choices[0], body, stream=True))
        return await sse.close()


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
    messages = check_messages(f.raw("messages"))
    return web.json_response({"prompt": await render(state, messages, f.bool("add_generation_prompt", True))})
