"""CPU-heavy request work (tokenizing, template rendering, detokenizing) on worker threads, never on the
event loop, so that /health and every stream keep answering while a 16 MiB prompt is tokenized.

The threads are daemons and bounded in number: a job that outlives its client still holds its worker
until it ends (a tokenizer call cannot be interrupted), and once all are busy new jobs wait in a
bounded line, beyond which the server answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

from engine.server.errors import ApiError

WORKERS = 4
MAX_WAITING = 256  # beyond the scheduler's queue, so that a burst of small requests meets that one first
INLINE_ITEMS = 4096  # text (characters) or token ids this short costs less than a thread hop


class Workers:
    def __init__(self, n: int = WORKERS, max_waiting: int = MAX_WAITING):
        self.n, self.max_waiting = n, max_waiting
        self._free: asyncio.Semaphore | None = None
        self._waiting = 0

    async def run(self, fn: Callable[..., Any], *args: Any, size: int | None = None) -> Any:
        """fn(*args) on a worker thread; `size` (characters or ids) this small runs it here instead."""
        if size is not None and size < INLINE_ITEMS:
            return fn(*args)
        if self._free is None:
            self._free = asyncio.Semaphore(self.n)
        if self._waiting >= self.max_waiting:
            raise ApiError(503, f"server busy: {self._waiting} requests wait for a tokenizer worker; retry later")
        self._waiting += 1
        try:
            await self._free.acquire()
        finally:
            self._waiting -= 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            self._free.release()  # only now: the thread was busy until here, whoever waited for it
            if not done.done():
                done.set_result(value) if ok else done.set_exception(value)

        def work() -> None:
            try:
                ok, value = True, fn(*args)
            except BaseException as e:  # handed to the loop, which raises it in the handler
                ok, value = False, e
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped meanwhile
                loop.call_soon_threadsafe(settle, ok, value)

        threading.Thread(target=work, name="engine-work", daemon=True).start()
        return await done


def json_list(items: list, chunk: int = 16384) -> str:
    """JSON of a long list, built in slices so that the worker thread building it lets go of the GIL between
    them (one json.dumps of millions of items would hold it, and the event loop with it, for a second)."""
    parts = [json.dumps(items[i:i + chunk], ensure_ascii=False)[1:-1] for i in range(0, len(items), chunk)]
    return "[" + ",".join(parts) + "]"
