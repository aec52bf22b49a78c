"""`--sleep-idle-seconds N`, as llama-server has it: after N seconds without a request the model's weights,
KV pool and scheduler are freed (the process and its port stay up); the next request that needs the model
loads it again first, by the same code as the launch, so it computes the same bits as before the sleep.

While asleep, /health, /props (`is_sleeping: true`), /v1/models (and /v1/models/{id}), /slots and /metrics
answer from what they said on entering sleep and do not wake the model; every other endpoint (/tokenize too)
wakes it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from aiohttp import web

from engine.metrics import add_counters
from engine.server.errors import ApiError

log = logging.getLogger("engine.server")

READ_ONLY = frozenset({"/health", "/v1/health", "/props", "/v1/models", "/models", "/v1/models/{model}", "/slots",
                       "/metrics"})  # routes, as aiohttp names them


class Sleeper:
    def __init__(self, state, seconds: float, load: Callable[[], None]):
        self.state, self.seconds = state, seconds
        self._load = load  # blocking: a worker thread runs it
        self.asleep: dict | None = None  # the read-only endpoints' answers while asleep
        self.stats_base: dict = {}  # counters of the schedulers before the last sleep
        self.busy = 0  # requests in progress that use the model
        self.last = time.monotonic()
        self.lock = asyncio.Lock()
        self._waking: asyncio.Future | None = None  # the wake in progress

    @property
    def sleeping(self) -> bool:
        return self.asleep is not None

    def stats(self) -> dict:
        """The scheduler's figures with the counters of earlier (slept) schedulers added."""
        if self.asleep is not None:
            return self.asleep["stats"]
        return add_counters(self.stats_base, self.state.scheduler.stats())

    async def watch(self) -> None:
        while True:
            due = self.last + self.seconds - time.monotonic()
            if self.busy or self.sleeping or self.state.generations or due > 0:
                # no deadline while busy or asleep: look again within a second (a wait of N could sleep at 2N)
                await asyncio.sleep(min(self.seconds, 1.0) if self.busy or self.sleeping else max(due, 0.05))
                continue
            try:
                await self._sleep()
            except Exception:  # the model stays as it was left; the watch goes on
                log.exception("going to sleep failed")
                self.last = time.monotonic()

    async def _sleep(self) -> None:
        async with self.lock:
            if self.busy or self.sleeping or self.state.generations:
                return
            state = self.state
            self.asleep = {**_snapshot(state), "stats": self.stats()}  # from here on requests wait to wake it
            self.stats_base = self.asleep["stats"]
            scheduler, state.scheduler = state.scheduler, None
            await asyncio.to_thread(scheduler.stop)
            state.loaded = None
            del scheduler
            await asyncio.to_thread(_release, state.backend)
            log.info("sleeping after %g s idle: the model's weights and KV cache are freed", self.seconds)

    async def wake(self) -> None:
        """Every request that finds the model asleep awaits the same wake, shielded: a client that leaves
        while the model loads cancels only its own wait, never the load, which the thread would finish
        anyway (a second wake would then load the model again beside it)."""
        if self._waking is None:
            self._waking = asyncio.ensure_future(self._wake())
            self._waking.add_done_callback(self._woken)
        await asyncio.shield(self._waking)

    def _woken(self, task: asyncio.Task) -> None:
        self._waking = None
        if not task.cancelled():
            task.exception()  # retrieved: a wake that failed with nobody left waiting is logged by _wake

    async def _wake(self) -> None:
        async with self.lock:
            if not self.sleeping:
                return
            t0 = time.perf_counter()
            try:
                await asyncio.to_thread(self._load)
            except Exception as e:  # stays asleep; the next request tries again
                log.error("waking failed: %s", e)
                raise ApiError(503, f"the model could not be loaded again after sleeping: {e}") from None
            self.asleep = None
            log.info("woke: the model is loaded again (%.2f s)", time.perf_counter() - t0)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        resource = request.match_info.route.resource
        if resource is None or request.method == "OPTIONS" or resource.canonical in READ_ONLY:
            return await handler(request)
        self.busy += 1  # before the wake: between the wake's end and this request's turn, the watch sees it
        try:
            if self.sleeping:
                await self.wake()
            return await handler(request)
        finally:
            self.busy -= 1
            self.last = time.monotonic()


def _snapshot(state) -> dict:
    from engine.server.native import props_body, slot_rows
    from engine.server.openai_api import model_card

    return {"props": props_body(state), "card": model_card(state, state.alias),
            "slots": slot_rows(state, state.scheduler.slots())}


def _release(backend: str) -> None:
    gc.collect()  # the model's arrays go with their last reference; cycles would keep them until a later gc
    if backend == "cuda":
        from lockstep_kernels.cuda import release_cached

        release_cached()
