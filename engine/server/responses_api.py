"""OpenAI's Responses API (/v1/responses), plain and streamed, over the chat path: `input` (text or
messages) and `instructions` become chat messages; the answer is one output message of output_text.

Supported: input, instructions, max_output_tokens, temperature, top_p, seed, stream, and llama-server's
timings_per_token / return_progress. Not supported: stored responses (previous_response_id), tools.
"""

from __future__ import annotations

import secrets
import time

from aiohttp import web

from engine.requests import Request
from engine.server.chat import text_of_parts
from engine.server.chat_render import build_prompt
from engine.server.completion import cap_predict
from engine.server.errors import bad_request
from engine.server.generation import Generation
from engine.server.params import (
    Fields,
    max_tokens,
    read_json,
    reject_unsupported,
    sampling,
    stop_strings,
)
from engine.server.run import EventStream, failure, generation
from engine.server.state import EngineState, state_of

_TEXT_PARTS = ("input_text", "output_text", "text")


def _messages(f: Fields) -> list[dict]:
    value = f.raw("input")
    messages = []
    if f.str("instructions"):
        messages.append({"role": "system", "content": f.str("instructions")})
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                raise bad_request(f"'input[{i}]' must be a message (other item types are not supported)")
            messages.append({"role": item.get("role"), "content": text_of_parts(item.get("content"), f"input[{i}].content", _TEXT_PARTS)})
    else:
        raise bad_request("'input' is required: a string or an array of messages")
    return messages


class Shape:
    def __init__(self, state: EngineState, gen: Generation, name: str, f: Fields):
        self.state, self.gen, self.name = state, gen, name
        self.id = "resp_" + secrets.token_hex(12)
        self.msg_id = "msg_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.temperature, self.top_p = gen.request.params.temperature, gen.request.params.top_p
        self.seq = 0

    def item(self, text: str, done: bool) -> dict:
        return {"type": "message", "id": self.msg_id, "status": "completed" if done else "in_progress",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if done else []}

    def response(self, status: str, text: str | None) -> dict:
        c = self.gen.choices[0]
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.name, "output": [] if text is None else [self.item(text, True)],
               "parallel_tool_calls": False, "tool_choice": "auto", "tools": [], "temperature": self.temperature,
               "top_p": self.top_p, "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if c.finish_reason == "length" else None}
        if status == "completed":
            done = c.done
            n_in, n_out = len(self.gen.request.prompt), len(c.tokens)
            out["usage"] = {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                            "input_tokens_details": {"cached_tokens": done.cached_tokens if done else 0},
                            "output_tokens_details": {"reasoning_tokens": 0}}
        return out

    def event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq, **fields}


async def responses(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    f = Fields(body)
    reject_unsupported(f)
    for name in ("previous_response_id", "tools"):
        if f.raw(name):
            raise bad_request(f"'{name}' is not supported on /v1/responses yet")
    chat = await build_prompt(state, Fields({"messages": _messages(f)}))
    req = Request(prompt=chat.ids, params=sampling(f, state.defaults, state.opts.seed, state.tokenizer),
                  max_tokens=cap_predict(state, max_tokens(f, "max_output_tokens", "max_tokens")),
                  return_progress=f.bool("return_progress", False), n_keep=state.opts.keep)
    async with generation(state, req, stop_strings(f)) as gen:
        shape = Shape(state, gen, state.model_name(body.get("model")), f)
        if not f.bool("stream", False):
            async for _ in gen.deltas():
                pass
            if err := failure(gen):
                raise err
            out = shape.response("completed", gen.choices[0].text)
            out["output_text"] = gen.choices[0].text
            return web.json_response(out)
        return await _stream(request, shape, gen, f.bool("timings_per_token", False))


async def input_tokens(request: web.Request) -> web.Response:
    """llama-server's /v1/responses/input_tokens: the rendered input's length, nothing generated."""
    state = state_of(request)
    chat = await build_prompt(state, Fields({"messages": _messages(Fields(await read_json(request)))}))
    return web.json_response({"object": "response.input_tokens", "input_tokens": len(chat.ids)})


async def _stream(request: web.Request, shape: Shape, gen: Generation, per_token: bool) -> web.StreamResponse:
    sse = EventStream(request)
    await sse.open()
    ids = {"item_id": shape.msg_id, "output_index": 0, "content_index": 0}
    await sse.send(shape.event("response.created", response=shape.response("in_progress", None)))
    await sse.send(shape.event("response.in_progress", response=shape.response("in_progress", None)))
    await sse.send(shape.event("response.output_item.added", output_index=0, item=shape.item("", False)))
    part = {"type": "output_text", "text": "", "annotations": []}
    await sse.send(shape.event("response.content_part.added", **ids, part=part))
    async for d in gen.deltas():
        if d.progress is not None:
            p = d.progress
            await sse.send(shape.event("response.in_progress", response=shape.response("in_progress", None),
                                       prompt_progress={"total": p.total, "cache": p.cache,
                                                        "processed": p.processed}))
        elif d.text:
            ev = shape.event("response.output_text.delta", **ids, delta=d.text)
            if per_token:
                ev["timings"] = gen.live_timings()
            await sse.send(ev)
    if err := failure(gen):
        await sse.error(err)
        return await sse.close()
    text = gen.choices[0].text
    await sse.send(shape.event("response.output_text.done", **ids, text=text))
    await sse.send(shape.event("response.content_part.done", **ids, part={**part, "text": text}))
    await sse.send(shape.event("response.output_item.done", output_index=0, item=shape.item(text, True)))
    done = gen.choices[0].done
    await sse.send({**shape.event("response.completed", response=shape.response("completed", text)),
                    "timings": dict(done.timings) if done and done.timings else {}})
    await sse.done()
    return await sse.close()
