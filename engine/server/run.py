"""Helpers the completion endpoints share: a generation's lifetime, and Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from engine.requests import Request
from engine.server.errors import ApiError
from engine.server.generation import Generation
from engine.server.state import EngineState

log = logging.getLogger("engine.server")


@asynccontextmanager
async def generation(state: EngineState, request: Request, stops: list[str]) -> AsyncIterator[Generation]:
    """Submits the request; on the way out (done, failed, or the client gone) aborts what still runs."""
    gen = Generation(state.scheduler, state.tokenizer, request, stops)
    gen.start()
    state.generations.add(gen)
    try:
        yield gen
    finally:
        state.generations.discard(gen)
        gen.close()
        for c in gen.choices:
            if c.done is not None and c.done.timings:
                state.served.add(c.done)


def failure(gen: Generation) -> ApiError | None:
    """A completion that ended in error fails the whole response."""
    for c in gen.choices:
        if c.finish_reason == "error":
            return ApiError(500, f"generation failed: {c.done.error if c.done else 'unknown error'}")
    return None


class EventStream:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, obj: dict) -> None:
        await self.response.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")

    async def error(self, err: ApiError) -> None:
        """After the headers went out, a failure can only be an event (OpenAI clients raise on it)."""
        await self.send(err.body())

    @asynccontextmanager
    async def failing_as_event(self) -> AsyncIterator[None]:
        """A stream that fails mid-way ends with an error event (as llama-server's do), never with a second
        response written inside the first; the caller then closes the stream."""
        try:
            yield
        except (asyncio.CancelledError, ConnectionError):
            raise
        except ApiError as e:
            await self.error(e)
        except Exception as e:
            log.error("%s %s failed mid-stream: %s: %s", self.request.method, self.request.path, type(e).__name__, e)
            await self.error(ApiError(500, f"internal error: {type(e).__name__}: {e}"))

    async def done(self) -> None:
        await self.response.write(b"data: [DONE]\n\n")

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response
