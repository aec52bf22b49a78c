"""OpenAI's shapes: /v1/models, /v1/completions and /v1/chat/completions, plain and streamed (SSE).

Parameters a request leaves out take the server's defaults, as llama-server does. Beyond OpenAI's
fields, responses carry the `seed` used (so a random one can be replayed), `preempt` parks/restores
per choice and in total, and llama-server's `timings`.
"""

from __future__ import annotations

import secrets
import time

from aiohttp import web

from engine.requests import Request
from engine.server.chat import chat_prompt, check_messages
from engine.server.errors import bad_request
from engine.server.generation import Choice, Delta, Generation, TokenOut
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
)
from engine.server.pieces import token_bytes
from engine.server.run import EventStream, failure, generation
from engine.server.state import EngineState, state_of


def _model_card(state: EngineState, name: str) -> dict:
    c = state.loaded.config
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "lockstep",
            "meta": {"n_ctx_train": c.max_position, "n_vocab": state.tokenizer.vocab_size,
                     "n_params": state.loaded.n_params, "n_embd": c.hidden}}


async def models(request: web.Request) -> web.Response:
    state = state_of(request)
    return web.json_response({"object": "list", "data": [_model_card(state, state.alias)]})


async def model(request: web.Request) -> web.Response:
    state = state_of(request)
    return web.json_response(_model_card(state, state.model_name(request.match_info["model"])))


# ---------------------------------------------------------------------------------------- parsing
def _common(state: EngineState, f: Fields, prompt: list[int], logprobs: int) -> tuple[Request, list[str]]:
    reject_unsupported(f)
    for name, what in (("tools", "tool calls"), ("functions", "function calls")):
        if f.raw(name):
            raise bad_request(f"'{name}': {what} are not supported yet")
    fmt = f.obj("response_format").raw("type", "text")
    if fmt != "text":
        raise bad_request(f"'response_format' type {fmt!r} is not supported yet (only 'text')")
    req = Request(
        prompt=prompt,
        params=sampling(f, state.defaults, state.opts.seed),
        max_tokens=max_tokens(f, "max_completion_tokens", "max_tokens", "n_predict"),
        n=f.int("n", 1, 1, MAX_N),
        logprobs=logprobs,
        cache_prompt=f.bool("cache_prompt", True),
        id_slot=f.int("id_slot", -1, -1, state.opts.parallel - 1),
    )
    return req, stop_strings(f)


async def _completion_request(state: EngineState, f: Fields) -> tuple[Request, list[str]]:
    for name in ("echo",):
        if f.bool(name, False):
            raise bad_request(f"'{name}' is not supported yet")
    if f.int("best_of", 1, 1, MAX_N) != 1:
        raise bad_request("'best_of' other than 1 is not supported yet")
    if f.str("suffix"):
        raise bad_request("'suffix' is not supported yet")
    prompt = await prompt_tokens(f.raw("prompt"), state)
    k = f.int("logprobs", -1, 0, MAX_TOP_LOGPROBS) if f.has("logprobs") else -1
    return _common(state, f, prompt, k)


async def _chat_request(state: EngineState, f: Fields) -> tuple[Request, list[str]]:
    messages = check_messages(f.raw("messages"))
    want = f.bool("logprobs", False)
    top = f.int("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if f.has("top_logprobs") and not want:
        raise bad_request("'top_logprobs' needs 'logprobs': true")
    return _common(state, f, await chat_prompt(state, messages), top if want else -1)


# ---------------------------------------------------------------------------------------- shapes
def _top_by_text(tok, top: list[tuple[int, float]]) -> dict[str, float]:
    """The legacy shape keys alternatives by text; two ids with one text (bytes of a character) keep the
    likelier, which comes first."""
    out: dict[str, float] = {}
    for i, lp in top:
        out.setdefault(tok.piece(i), lp)
    return out


def _completion_logprobs(tok, tokens: list[TokenOut], with_top: bool) -> dict:
    return {
        "tokens": [tok.piece(t.id) for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [_top_by_text(tok, t.top or []) for t in tokens] if with_top else None,
        "text_offset": [t.offset for t in tokens],
    }


def _chat_logprob(tok, token_id: int, logprob: float) -> dict:
    return {"token": tok.piece(token_id), "logprob": logprob, "bytes": list(token_bytes(tok, token_id))}


def _chat_logprobs(tok, tokens: list[TokenOut]) -> dict:
    return {"content": [{**_chat_logprob(tok, t.id, t.logprob),
                         "top_logprobs": [_chat_logprob(tok, i, lp) for i, lp in t.top or []]} for t in tokens]}


class Shape:
    """The parts of a response both endpoints share; `chat` picks message/delta over text."""

    def __init__(self, state: EngineState, gen: Generation, chat: bool, name: str):
        self.state, self.gen, self.chat = state, gen, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = name
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def _logprobs(self, tokens: list[TokenOut]) -> dict | None:
        req = self.gen.request
        if req.logprobs < 0:
            return None
        tok = self.state.tokenizer
        return _chat_logprobs(tok, tokens) if self.chat else _completion_logprobs(tok, tokens, req.logprobs > 0)

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.state.build_info, "seed": self.gen.request.params.seed}

    def usage(self) -> dict:
        done = [c.done for c in self.gen.choices if c.done]
        prompt = len(self.gen.request.prompt)
        completion = sum(len(c.tokens) for c in self.gen.choices)
        cached = done[0].cached_tokens if done else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def totals(self) -> dict:
        choices = self.gen.choices
        first = choices[0].done
        return {"preempt": {"parks": sum(c.preempt["parks"] for c in choices),
                            "restores": sum(c.preempt["restores"] for c in choices)},
                "timings": dict(first.timings) if first and first.timings else {}}

    def choice(self, c: Choice) -> dict:
        body = {"message": {"role": "assistant", "content": c.text}} if self.chat else {"text": c.text}
        return {"index": c.index, **body, "finish_reason": c.finish_reason, "logprobs": self._logprobs(c.tokens),
                "preempt": c.preempt}

    def response(self) -> dict:
        return {**self.head(self.object), "choices": [self.choice(c) for c in self.gen.choices],
                "usage": self.usage(), **self.totals()}

    def chunk(self, d: Delta) -> dict:
        content = {"delta": {"content": d.text} if d.text else {}} if self.chat else {"text": d.text}
        choice = {"index": d.index, **content, "finish_reason": d.finish_reason,
                  "logprobs": self._logprobs(d.tokens) if d.tokens else None}
        if d.finish_reason is not None:
            choice["preempt"] = self.gen.choices[d.index].preempt
        return {**self.head(self.chunk_object), "choices": [choice]}

    def role_chunk(self, index: int) -> dict:
        return {**self.head(self.chunk_object),
                "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                             "logprobs": None}]}


# ---------------------------------------------------------------------------------------- handlers
async def completions(request: web.Request) -> web.StreamResponse:
    return await _respond(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _respond(request, chat=True)


async def _respond(request: web.Request, chat: bool) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    f = Fields(body)
    req, stops = await (_chat_request(state, f) if chat else _completion_request(state, f))
    stream = f.bool("stream", False)
    include_usage = f.obj("stream_options").bool("include_usage", False)
    async with generation(state, req, stops) as gen:
        shape = Shape(state, gen, chat, state.model_name(body.get("model")))
        if not stream:
            async for _ in gen.deltas():
                pass
            if err := failure(gen):
                raise err
            return web.json_response(shape.response())
        sse = EventStream(request)
        await sse.open()
        async with sse.failing_as_event():
            await _stream(sse, shape, gen, chat, include_usage)
        return await sse.close()


async def _stream(sse: EventStream, shape: Shape, gen: Generation, chat: bool, include_usage: bool) -> None:
    if chat:
        for i in range(gen.request.n):
            await sse.send(shape.role_chunk(i))
    async for d in gen.deltas():
        chunk = shape.chunk(d)
        if d.finish_reason is not None and gen.finished and not include_usage:
            chunk.update(shape.totals())  # the last chunk carries what a final body would
        await sse.send(chunk)
    if err := failure(gen):
        await sse.error(err)
        return
    if include_usage:
        await sse.send({**shape.head(shape.chunk_object), "choices": [], "usage": shape.usage(),
                        **shape.totals()})
    await sse.done()
