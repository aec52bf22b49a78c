"""llama-server's /completion: prompts in its forms, its response fields, plain and streamed.

A prompt is text, token ids, text and ids mixed in one array, or `{"prompt_string": ...}`; an array of
prompts gives an array of results in prompt order (each prompt its own request).
"""

from __future__ import annotations

import asyncio
import math
from contextlib import AsyncExitStack
from dataclasses import asdict
from typing import Any

from aiohttp import web

from engine.requests import Request
from engine.server.errors import bad_request
from engine.server.generation import Choice, Generation, TokenOut
from engine.server.params import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    Fields,
    check_fits,
    kind_of,
    max_tokens,
    nonempty,
    read_json,
    reject_unsupported,
    sampling,
    shift_fields,
    stop_strings,
    token_ids,
)
from engine.server.pieces import token_bytes
from engine.server.run import EventStream, failure, generation
from engine.server.state import EngineState, state_of

MAX_PROMPTS = 16


def _one_prompt(value: Any, state: EngineState, where: str) -> list[int]:  # a worker thread for text
    tok = state.tokenizer
    if isinstance(value, dict):
        if value.get("multimodal_data"):
            raise bad_request(f"'{where}': multimodal data is not supported (text models only)")
        value = value.get("prompt_string")
        if not isinstance(value, str):
            raise bad_request(f"'{where}.prompt_string' must be a string")
    if isinstance(value, str):
        check_fits(state, value, where)
        ids = tok.encode(value, add_special=True) if value else []
    elif isinstance(value, list) and any(isinstance(v, str) for v in value):
        ids = []  # text and token ids mixed: the text is tokenized in place, BOS only before a leading text
        for i, v in enumerate(value):
            if isinstance(v, str):
                ids += tok.encode(v, add_special=i == 0)
            else:
                ids += token_ids([v], tok.vocab_size, f"{where}[{i}]")
    elif isinstance(value, list):
        ids = token_ids(value, tok.vocab_size, where)
    else:
        raise bad_request(f"'{where}' must be a string, an array of token ids or an object, not {kind_of(value)}")
    return nonempty(ids, where)


def _text_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return _text_size(value.get("prompt_string"))
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    return 1


async def prompts(value: Any, state: EngineState) -> list[list[int]]:
    if value is None:
        raise bad_request("'prompt' is required")
    many = isinstance(value, list) and value and (
        any(isinstance(v, list | dict) for v in value) or all(isinstance(v, str) for v in value))
    if many and len(value) > MAX_PROMPTS:
        raise bad_request(f"'prompt' holds {len(value)} prompts; at most {MAX_PROMPTS}")

    def work() -> list[list[int]]:
        if not many:
            return [_one_prompt(value, state, "prompt")]
        return [_one_prompt(v, state, f"prompt[{i}]") for i, v in enumerate(value)]

    return await state.workers.run(work, size=_text_size(value))


def cap_predict(state: EngineState, n: int) -> int:
    """The server's -n is the limit of a request that sets none, as llama-server's n_predict."""
    default = getattr(state.opts, "n_predict", -1)
    return default if n < 0 and default is not None and default >= 0 else n


def json_bias(bias: tuple) -> list[dict]:
    return [{"bias": None if math.isinf(b) else b, "token": t} for t, b in bias]  # null is -inf, as llama-server


def settings(req: Request, stops: list[str], stream: bool) -> dict:
    params = asdict(req.params)
    params["logit_bias"] = json_bias(req.params.logit_bias)
    return {**params, "n_predict": req.max_tokens, "stop": stops, "n_probs": max(req.logprobs, 0),
            "cache_prompt": req.cache_prompt, "stream": stream}


def _prob_entry(tok, token_id: int, logprob: float, post: bool) -> dict:
    entry = {"id": token_id, "token": tok.piece(token_id), "bytes": list(token_bytes(tok, token_id))}
    if post:
        entry["prob"] = math.exp(logprob)
    else:
        entry["logprob"] = logprob
    return entry


def probs(tok, tokens: list[TokenOut], post: bool) -> list[dict]:
    key = "top_probs" if post else "top_logprobs"
    return [{**_prob_entry(tok, t.id, t.logprob, post), key: [_prob_entry(tok, i, lp, post) for i, lp in t.top or []]}
            for t in tokens]


def _project(body: dict, fields: list[str]) -> dict:
    """llama-server's response_fields: only these, a/b naming a nested field (kept under that name)."""
    out = {}
    for name in fields:
        value: Any = body
        for part in name.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[name] = value
    return out


class Native:
    def __init__(self, state: EngineState, f: Fields, body: dict):
        self.state, self.f = state, f
        self.stream = f.bool("stream", False)
        self.stops = stop_strings(f)
        self.return_tokens = f.bool("return_tokens", False)
        self.verbose = f.bool("verbose", False) or getattr(state.opts, "verbose", False)
        self.fields = f.raw("response_fields", [])
        if not isinstance(self.fields, list) or not all(isinstance(x, str) for x in self.fields):
            raise bad_request("'response_fields' must be an array of field names")
        self.timings_per_token = f.bool("timings_per_token", False)

    def request(self, prompt: list[int]) -> Request:
        f, state = self.f, self.state
        n_probs = f.int("n_probs", 0, 0, MAX_TOP_LOGPROBS)
        return Request(prompt=prompt, params=sampling(f, state.defaults, state.opts.seed, state.tokenizer),
                       max_tokens=cap_predict(state, max_tokens(f, "n_predict", "max_tokens")),
                       logprobs=n_probs if n_probs > 0 else -1, cache_prompt=f.bool("cache_prompt", True),
                       id_slot=f.int("id_slot", -1, -1, self.state.opts.parallel - 1), n=f.int("n", 1, 1, MAX_N),
                       return_progress=f.bool("return_progress", False), **shift_fields(f, self.state.opts.keep))

    def summary(self, gen: Generation, choice: Choice) -> dict:
        state, req, done = self.state, gen.request, choice.done
        timings = dict(done.timings) if done and done.timings else {}
        timings["cache_n"] = done.cached_tokens if done else 0
        prompt_text = self.prompt_texts[id(req)]
        out = {
            "index": choice.index,
            "content": "" if self.stream else choice.text,
            "tokens": [t.id for t in choice.tokens] if self.return_tokens and not self.stream else [],
            "id_slot": req.id_slot,
            "stop": True,
            "model": state.alias,
            "tokens_predicted": len(choice.tokens),
            "tokens_evaluated": len(req.prompt),
            "tokens_cached": done.cached_tokens if done else 0,
            "generation_settings": settings(req, self.stops, self.stream),
            "prompt": prompt_text,
            "has_new_line": "\n" in choice.text,
            # the generation filled the slot's context (llama-server: truncated)
            "truncated": choice.finish_reason == "length" and
            len(req.prompt) + len(choice.tokens) >= state.scheduler.n_ctx_seq,
            "stop_type": choice.stop_type,
            "stopping_word": choice.stopping_word,
            "timings": timings,
            "seed": req.params.seed,
            "preempt": choice.preempt,
        }
        if req.logprobs > 0 and not self.stream:
            out["completion_probabilities"] = probs(state.tokenizer, choice.tokens, req.params.post_sampling_probs)
        if self.verbose:
            out["__verbose"] = {"prompt": prompt_text, "content": choice.text}
        return _project(out, self.fields) if self.fields else out

    async def run(self, request: web.Request, prompt_list: list[list[int]]) -> web.StreamResponse:
        reqs = [self.request(p) for p in prompt_list]
        decode = self.state.tokenizer.decode
        self.prompt_texts = {id(r): await self.state.workers.run(decode, r.prompt, False, size=len(r.prompt))
                             for r in reqs}
        if self.stream and (len(reqs) > 1 or reqs[0].n > 1):
            raise bad_request("several prompts, or 'n' > 1, are not supported with 'stream' on /completion")
        if self.stream:
            return await self._stream(request, reqs[0])
        async with AsyncExitStack() as stack:
            gens = [await stack.enter_async_context(generation(self.state, r, self.stops)) for r in reqs]
            await asyncio.gather(*(self._drain(g) for g in gens))
            for g in gens:
                if err := failure(g):
                    raise err
            results = [self.summary(g, c) for g in gens for c in g.choices]
        if len(results) == 1:
            return web.json_response(results[0])
        for i, r in enumerate(results):
            r["index"] = i
        return web.json_response(results)

    @staticmethod
    async def _drain(gen: Generation) -> None:
        async for _ in gen.deltas():
            pass

    async def _stream(self, request: web.Request, req: Request) -> web.StreamResponse:
        tok = self.state.tokenizer
        async with generation(self.state, req, self.stops) as gen:
            sse = EventStream(request)
            await sse.open()
            async with sse.failing_as_event():
                await self._send_stream(sse, gen, req, tok)
            return await sse.close()

    async def _send_stream(self, sse: EventStream, gen: Generation, req: Request, tok) -> None:
        async for d in gen.deltas():
            chunk = None
            if d.progress is not None:
                p = d.progress
                chunk = {"index": 0, "content": "", "tokens": [], "stop": False,
                         "prompt_progress": {"total": p.total, "cache": p.cache, "processed": p.processed,
                                             "time_ms": gen.live_timings()["prompt_ms"]}}
                if p.processed == p.cache:
                    chunk["timings"] = {**gen.live_timings(), "prompt_n": 0, "prompt_ms": 0.0}
            elif d.text or d.tokens:
                chunk = {"index": 0, "content": d.text, "tokens": [t.id for t in d.tokens], "stop": False,
                         "id_slot": req.id_slot, "tokens_predicted": len(gen.choices[0].tokens),
                         "tokens_evaluated": len(req.prompt)}
                if req.logprobs > 0:
                    chunk["completion_probabilities"] = probs(tok, d.tokens, req.params.post_sampling_probs)
            if chunk is None:
                continue
            if self.timings_per_token and "timings" not in chunk:
                chunk["timings"] = gen.live_timings()
            await sse.send(chunk)
        if err := failure(gen):
            await sse.error(err)
        else:
            await sse.send(self.summary(gen, gen.choices[0]))


async def completion(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    f = Fields(body)
    reject_unsupported(f)
    native = Native(state, f, body)
    return await native.run(request, await prompts(f.raw("prompt"), state))
