"""Where the HTTP side hands work to the compute thread, and what it reads back.

Neither side waits for the other: `submit` and `cancel` take a lock the compute thread holds only to
take what arrived, never across a step, a park or a restore; `stats` and `slots` read the snapshot
the compute thread last published.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from engine.requests import QueueFullError, Request

Arrival = tuple[int, Request, Callable]


class Inbox:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.cv = threading.Condition()
        self._requests: deque[Arrival] = deque()
        self._cancels: set[tuple[int, int | None]] = set()
        self._calls: list[tuple[Callable[[], object], Future]] = []
        self._ids = 0
        self.queued = 0  # submitted and not yet admitted or cancelled
        self.stopped = False

    def submit(self, req: Request, on_event: Callable) -> int:
        with self.cv:
            if self.queued >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({self.max_queue} waiting)")
            self._ids += 1
            self._requests.append((self._ids, req, on_event))
            self.queued += 1
            self.cv.notify_all()
            return self._ids

    def cancel(self, request_id: int, index: int | None) -> None:
        with self.cv:
            self._cancels.add((request_id, index))
            self.cv.notify_all()

    def call(self, fn: Callable[[], object]) -> Future:
        """fn() to be run on the compute thread between steps; the future holds its result."""
        done: Future = Future()
        with self.cv:
            self._calls.append((fn, done))
            self.cv.notify_all()
        return done

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    def poke(self) -> None:
        with self.cv:
            self.cv.notify_all()

    @property
    def pending(self) -> bool:
        return bool(self._requests or self._cancels or self._calls)

    def take(self) -> tuple[list[Arrival], set[tuple[int, int | None]], list[tuple[Callable, Future]]]:
        """Everything that arrived since the last take (the caller holds `cv`)."""
        arrived, self._requests = list(self._requests), deque()
        cancels, self._cancels = self._cancels, set()
        calls, self._calls = self._calls, []
        return arrived, cancels, calls

    def left_queue(self, n: int) -> None:
        """n requests were admitted or cancelled while waiting."""
        if n:
            with self.cv:
                self.queued -= n


def run_call(fn: Callable[[], object], done: Future) -> None:
    try:
        done.set_result(fn())
    except Exception as e:  # handed to the caller, whose request it fails
        done.set_exception(e)
