"""OpenAI's shapes: /v1/models, /v1/completions and /v1/chat/completions, plain and streamed (SSE).

Parameters a request leaves out take the server's defaults, as llama-server does. Beyond OpenAI's
fields, responses carry the `seed` used (so a random one can be replayed), `preempt` parks/restores
per choice and in total, and llama-server's `timings`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import replace

from aiohttp import web

from engine.requests import Request
from engine.server.chat_output import ReasoningSplitter, parse_tool_calls
from engine.server.chat_render import ChatPrompt, build_prompt
from engine.server.completion import cap_predict
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
    shift_fields,
    stop_strings,
)
from engine.server.pieces import token_bytes
from engine.server.run import EventStream, failure, generation
from engine.server.state import EngineState, state_of


def model_card(state: EngineState, name: str) -> dict:
    if state.sleeping:  # the model is not loaded: its figures as they were on entering sleep
        return {**state.sleeper.asleep["card"], "id": name}
    c = state.loaded.config
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "lockstep",
            "aliases": state.aliases, "tags": getattr(state.opts, "tags", []),
            "meta": {"n_ctx_train": c.max_position, "n_vocab": state.tokenizer.vocab_size,
                     "n_params": state.loaded.n_params, "n_embd": c.hidden}}


async def models(request: web.Request) -> web.Response:
    state = state_of(request)
    return web.json_response({"object": "list", "data": [model_card(state, state.alias)]})


async def model(request: web.Request) -> web.Response:
    state = state_of(request)
    return web.json_response(model_card(state, state.model_name(request.match_info["model"])))


# ---------------------------------------------------------------------------------------- parsing
def _common(state: EngineState, f: Fields, prompt: list[int], logprobs: int) -> tuple[Request, list[str]]:
    reject_unsupported(f)
    if f.raw("functions"):
        raise bad_request("'functions' (the legacy form) is not supported; use 'tools'")
    req = Request(
        prompt=prompt,
        params=sampling(f, state.defaults, state.opts.seed, state.tokenizer),
        max_tokens=cap_predict(state, max_tokens(f, "max_completion_tokens", "max_tokens", "n_predict")),
        n=f.int("n", 1, 1, MAX_N),
        logprobs=logprobs,
        cache_prompt=f.bool("cache_prompt", True),
        id_slot=f.int("id_slot", -1, -1, state.opts.parallel - 1),
        return_progress=f.bool("return_progress", False),
        **shift_fields(f, state.opts.keep),
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


async def _chat_request(state: EngineState, f: Fields) -> tuple[Request, list[str], ChatPrompt]:
    want = f.bool("logprobs", False)
    top = f.int("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if f.has("top_logprobs") and not want:
        raise bad_request("'top_logprobs' needs 'logprobs': true")
    chat = await build_prompt(state, f)
    req, stops = _common(state, f, chat.ids, top if want else -1)
    if chat.grammar:
        req.params = replace(req.params, grammar=chat.grammar)
    return req, stops, chat


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

    def __init__(self, state: EngineState, gen: Generation, chat: bool, name: str, prompt: ChatPrompt | None = None):
        self.state, self.gen, self.chat = state, gen, chat
        self.prompt = prompt
        self.parts = [Parts(prompt) for _ in gen.choices] if chat else []
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
        finish = c.finish_reason
        if self.chat:
            message = self.parts[c.index].whole(c.text)
            if message.get("tool_calls") and finish == "stop":
                finish = "tool_calls"
            body = {"message": message}
        else:
            body = {"text": c.text}
        return {"index": c.index, **body, "finish_reason": finish, "logprobs": self._logprobs(c.tokens),
                "preempt": c.preempt}

    def response(self) -> dict:
        return {**self.head(self.object), "choices": [self.choice(c) for c in self.gen.choices],
                "usage": self.usage(), **self.totals()}

    def chunks(self, d: Delta) -> list[dict]:
        """A delta's chunks: its text first, then (at the end) a chunk whose delta is empty, as llama-server."""
        out = []
        finish = d.finish_reason
        if self.chat:
            delta = self.parts[d.index].piece(d.text, final=finish is not None)
            if delta.get("tool_calls") and finish == "stop":
                finish = "tool_calls"
        else:
            delta = {"text": d.text} if d.text else {}
        if delta or d.tokens or finish is None:
            body = {"delta": delta} if self.chat else {"text": d.text}
            out.append({"index": d.index, **body, "finish_reason": None,
                        "logprobs": self._logprobs(d.tokens) if d.tokens else None})
        if finish is not None:
            end = {"index": d.index, **({"delta": {}} if self.chat else {"text": ""}), "finish_reason": finish,
                   "logprobs": None, "preempt": self.gen.choices[d.index].preempt}
            out.append(end)
        return [{**self.head(self.chunk_object), "choices": [c]} for c in out]

    def role_chunk(self, index: int) -> dict:
        return {**self.head(self.chunk_object),
                "choices": [{"index": index, "delta": {"role": "assistant", "content": None}, "finish_reason": None,
                             "logprobs": None}]}


class Parts:
    """One choice's text as message parts: reasoning, content, tool calls (held back to the end when tools
    were declared, since a call is known only once whole)."""

    def __init__(self, prompt: ChatPrompt | None):
        self.tools = prompt.tools if prompt else None
        self.split = ReasoningSplitter(prompt.think if prompt else None, bool(prompt and prompt.thinking_open))
        self.reasoning, self.content = "", ""

    def piece(self, text: str, final: bool) -> dict:
        r, c = self.split.feed(text, final)
        self.reasoning += r
        self.content += c
        out = {"reasoning_content": r} if r else {}
        if not self.tools:
            return {**out, **({"content": c} if c else {})}
        if not final:
            return out
        content, calls = parse_tool_calls(self.content, self.tools)
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return out

    def whole(self, text: str) -> dict:
        self.piece(text, final=True)
        content, calls = parse_tool_calls(self.content, self.tools)
        msg = {"role": "assistant", "content": content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning.strip()
        if calls:
            msg["tool_calls"] = calls
        return msg


# ---------------------------------------------------------------------------------------- handlers
async def completions(request: web.Request) -> web.StreamResponse:
    return await _respond(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _respond(request, chat=True)


async def _respond(request: web.Request, chat: bool) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    f = Fields(body)
    prompt = None
    if chat:
        req, stops, prompt = await _chat_request(state, f)
    else:
        req, stops = await _completion_request(state, f)
    stream = f.bool("stream", False)
    include_usage = f.obj("stream_options").bool("include_usage", False)
    verbose = f.bool("verbose", False) or getattr(state.opts, "verbose", False)
    async with generation(state, req, stops) as gen:
        shape = Shape(state, gen, chat, state.model_name(body.get("model")), prompt)
        if not stream:
            async for _ in gen.deltas():
                pass
            if err := failure(gen):
                raise err
            out = shape.response()
            if verbose:
                text = prompt.text if prompt else \
                    await state.workers.run(state.tokenizer.decode, req.prompt, False, size=len(req.prompt))
                out["__verbose"] = {"prompt": text}
            return web.json_response(out)
        sse = EventStream(request)
        await sse.open()
        async with sse.failing_as_event():
            await _stream(sse, shape, gen, chat, include_usage, f.bool("timings_per_token", False))
        return await sse.close()


async def _stream(sse: EventStream, shape: Shape, gen: Generation, chat: bool, include_usage: bool,
                  per_token: bool) -> None:
    if chat:
        for i in range(gen.request.n):
            await sse.send(shape.role_chunk(i))
    async for d in gen.deltas():
        if d.progress is not None:
            p = d.progress
            await sse.send({**shape.head(shape.chunk_object), "choices": [],
                            "prompt_progress": {"total": p.total, "cache": p.cache, "processed": p.processed,
                                                "time_ms": gen.live_timings()["prompt_ms"]}})
            continue
        chunks = shape.chunks(d)
        if per_token:
            for chunk in chunks:
                chunk["timings"] = gen.live_timings()
        if chunks and d.finish_reason is not None and gen.finished and not include_usage:
            chunks[-1].update(shape.totals())  # the last chunk carries what a final body would
        for chunk in chunks:
            await sse.send(chunk)
    if err := failure(gen):
        await sse.error(err)
        return
    if include_usage:
        await sse.send({**shape.head(shape.chunk_object), "choices": [], "usage": shape.usage(),
                        **shape.totals()})
    await sse.done()
