"""One request's run through the scheduler, seen from the event loop as a stream of text deltas.

The scheduler calls back on its compute thread; events hop to the loop through a queue. Text-level
stop strings are matched here: a completion that hits one is finished for the client at once, and
the scheduler request is cancelled as soon as no completion of it is still wanted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.requests import DoneEvent, ProgressEvent, QueueFullError, Request, TokenEvent, call_each
from engine.server.errors import ApiError
from engine.textstream import TextStream
from engine.timings import timings as make_timings

STOP_TYPES = {"stop": "eos", "length": "limit", "abort": "abort", "error": "error"}


@dataclass
class TokenOut:
    id: int
    logprob: float | None
    top: list[tuple[int, float]] | None
    offset: int  # where its text starts in the completion's text


@dataclass
class Delta:
    index: int
    text: str
    tokens: list[TokenOut]
    finish_reason: str | None = None
    progress: ProgressEvent | None = None  # prompt processing news (return_progress); no text with it


@dataclass
class Choice:
    index: int
    stream: TextStream
    events: list[TokenEvent] = field(default_factory=list)  # per pushed token, aligned with stream.ids
    tokens: list[TokenOut] = field(default_factory=list)  # released to the client
    finish_reason: str | None = None
    stop_type: str = "none"  # llama-server's: eos, limit, word (a stop string), abort, error
    stopping_word: str = ""
    done: DoneEvent | None = None

    @property
    def text(self) -> str:
        return self.stream.released_text

    @property
    def preempt(self) -> dict:
        d = self.done
        return {"parks": d.parks if d else 0, "restores": d.restores if d else 0}


class LoopDispatch:
    """The scheduler's dispatch for a server: a step's events reach the loop in one wake-up, and
    steps whose events the loop has not taken yet join that wake-up instead of writing another.

    A wake-up is a write to the loop's self-pipe, which releases the GIL: the woken loop then holds
    it while the compute thread waits to go on, so each one saved is a stall saved. The flag and the
    deque are touched under the GIL only (no lock): the loop clears the flag before it drains, so a
    batch appended while the flag still read set is drained by that same callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._batches: deque = deque()
        self._armed = False

    def __call__(self, batch) -> None:  # compute thread
        self._batches.append(batch)
        if self._armed:
            return
        self._armed = True
        with contextlib.suppress(RuntimeError):  # the loop closed at shutdown: nobody is listening
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:  # event loop
        self._armed = False
        while self._batches:
            call_each(self._batches.popleft())


class Generation:
    def __init__(self, scheduler, tokenizer, request: Request, stops: list[str]):
        self.scheduler, self.request = scheduler, request
        self.choices = [Choice(i, TextStream(tokenizer, stops)) for i in range(request.n)]
        self.request_id: int | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancelled = False
        self.t_start = time.perf_counter()
        self.t_first: float | None = None  # when the first token arrived

    def start(self) -> None:
        n_prompt, n_ctx = len(self.request.prompt), self.scheduler.n_ctx_seq
        if n_prompt >= n_ctx:  # llama-server's error, with its fields
            raise ApiError(400, f"the request exceeds the available context size: {n_prompt} prompt tokens, "
                                f"{n_ctx} per slot (raise --ctx-size)", "exceed_context_size_error",
                           extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})
        try:  # events arrive on the event loop (the scheduler's dispatch is LoopDispatch)
            self.request_id = self.scheduler.submit(self.request, self._queue.put_nowait)
        except QueueFullError as e:
            raise ApiError(503, f"server busy: {e}; retry later") from None
        except ValueError as e:
            kind = "exceed_context_size_error" if "context" in str(e) else None
            raise ApiError(400, str(e), kind) from None

    @property
    def finished(self) -> bool:
        return all(c.done is not None for c in self.choices)

    def close(self) -> None:
        """Abort what still runs (the client left, or every completion already stopped on a string)."""
        if self.request_id is not None and not self.finished and not self._cancelled:
            self._cancelled = True
            self.scheduler.cancel(self.request_id)

    def abort(self, error: ApiError) -> None:
        """Ends deltas() with `error` (the server is stopping); the scheduler request is cancelled on close."""
        self._queue.put_nowait(error)

    async def deltas(self) -> AsyncIterator[Delta]:
        while not self.finished:
            event = await self._queue.get()
            if isinstance(event, ApiError):
                raise event
            choice = self.choices[event.index]
            if isinstance(event, ProgressEvent):
                yield Delta(event.index, "", [], progress=event)
            elif isinstance(event, TokenEvent):
                if self.t_first is None:
                    self.t_first = time.perf_counter()
                delta = self._on_token(choice, event)
                if delta is not None:
                    yield delta
            else:
                for delta in self._on_done(choice, event):
                    yield delta

    def _on_token(self, choice: Choice, event: TokenEvent) -> Delta | None:
        if choice.finish_reason is not None:
            return None  # stopped on a string while its siblings run on
        choice.events.append(event)
        released = choice.stream.push(event.token)
        delta = self._delta(choice, released)
        if released.stop is not None:
            choice.finish_reason, choice.stop_type, choice.stopping_word = "stop", "word", released.stop
            delta.finish_reason = "stop"
            if all(c.finish_reason is not None for c in self.choices):
                self.close()
            elif self.request_id is not None:
                self.scheduler.cancel(self.request_id, choice.index)
        return delta if delta.text or delta.tokens or delta.finish_reason else None

    def _on_done(self, choice: Choice, event: DoneEvent) -> list[Delta]:
        choice.done = event
        out = []
        if choice.finish_reason is None:
            choice.finish_reason, choice.stop_type = event.finish_reason, STOP_TYPES.get(event.finish_reason, "none")
            delta = self._delta(choice, choice.stream.finish())
            delta.finish_reason = event.finish_reason
            out.append(delta)
        return out

    def live_timings(self) -> dict:
        """timings_per_token: the figures so far, measured here (the scheduler's come with the end)."""
        now = time.perf_counter()
        first = self.t_first or now
        c = self.choices[0]
        done = c.done
        cached = done.cached_tokens if done else 0
        return make_timings(len(self.request.prompt) - cached, (first - self.t_start) * 1000,
                            len(c.stream.ids), (now - first) * 1000 if self.t_first else 0.0)

    def _delta(self, choice: Choice, released) -> Delta:
        out = []
        for i in released.tokens:
            ev = choice.events[i]
            out.append(TokenOut(ev.token, ev.logprob, ev.top, choice.stream.starts[i]))
        choice.tokens.extend(out)
        return Delta(choice.index, released.text, out)

