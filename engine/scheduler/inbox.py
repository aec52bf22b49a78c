"""Where the HTTP side hands work to the compute thread, and what it reads back.

Neither side waits for the other: `submit` and `cancel` take a lock the compute thread holds only to
take what arrived, never across a step, a park or a restore; `stats` and `slots` read the snapshot
the compute thread last published.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from engine.requests import QueueFullError, Request

Arrival = tuple[int, Request, Callable]


class Inbox:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.cv = threading.Condition()
        self._requests: deque[Arrival] = deque()
        self._cancels: set[tuple[int, int | None]] = set()
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

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    def poke(self) -> None:
        with self.cv:
            self.cv.notify_all()

    @property
    def pending(self) -> bool:
        return bool(self._requests or self._cancels)

    def take(self) -> tuple[list[Arrival], set[tuple[int, int | None]]]:
        """Everything that arrived since the last call (the caller holds `cv`)."""
        arrived, self._requests = list(self._requests), deque()
        cancels, self._cancels = self._cancels, set()
        return arrived, cancels

    def left_queue(self, n: int) -> None:
        """n requests were admitted or cancelled while waiting."""
        if n:
            with self.cv:
                self.queued -= n
