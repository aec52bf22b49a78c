"""Continuous batching over slots, page-granular admission, parking and restore.

One compute thread runs steps. Each step takes every running sequence's pending tokens (one for a
decoding sequence, a chunk of the prompt for a prefilling one) up to the token budget, runs them as
one batch and samples where a sequence reached its last token. Under row invariance none of these
choices changes any sequence's bits, which is what makes the output exact.

The parts: `slots` (slot table, prompt caches, admission), `memory` (pages, parks, restores,
per-sequence state), `planner` (what the next step runs), `step` (one step's launch, the step
launched ahead, results back to sequences), `emitter` (sampling, verification, forks,
finishing), `inbox` (what crosses between the HTTP side and this thread). This loop owns the
thread, admission between steps and the snapshot.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from contract.env import PREEMPT_EVERY
from engine.kv_cache import seq_context
from engine.modes import PreemptMode
from engine.recurrent_state import RecurrentStates
from engine.requests import Event, Request, call_each
from engine.runner import Runner
from engine.scheduler.context import Context, available_host_bytes
from engine.scheduler.emitter import Emitter
from engine.scheduler.inbox import Inbox, run_call
from engine.scheduler.memory import SeqState, StateManager
from engine.scheduler.planner import Planner
from engine.scheduler.slots import SlotTable, Waiting
from engine.scheduler.snapshot import Snapshot
from engine.scheduler.step import Stepper
from engine.tokenizer import TextTokenizer
from lockstep_kernels.base import PAGE_SIZE

log = logging.getLogger("engine.scheduler")


class Scheduler:
    def __init__(self, runner: Runner, tokenizer: TextTokenizer, *, n_slots: int, n_ctx: int, n_batch: int,
                 n_ubatch: int, kv_unified: bool, preempt_ram_bytes: int, preempt_every: int = 0,
                 max_queue: int = 64, spec_n_max: int = 0,
                 dispatch: Callable[[list[tuple[Callable, Event]]], None] = call_each,
                 states: list[SeqState] | None = None, preempt_mode: PreemptMode = "auto",
                 context_shift: bool = False, drafter: Callable | None = None):
        """`dispatch` receives each step's events at once, on the compute thread: a server hands the
        whole batch to its event loop with one wake-up instead of one per token. `states`: holders
        of per-sequence state besides KV pages (see `memory.SeqState`). `preempt_mode`: see
        `engine.modes.PreemptMode`; with "park" the parking budget is at least the host's available memory."""
        if preempt_mode == "park":
            preempt_ram_bytes = max(preempt_ram_bytes, available_host_bytes())
        self.runner, self.tokenizer, self.pool = runner, tokenizer, runner.pool
        self.ctx = Context(
            n_ctx_seq=seq_context(n_ctx, n_slots, kv_unified, self.pool.n_pages * PAGE_SIZE),
            budget=max(1, min(n_batch, n_ubatch)), preempt_ram_bytes=preempt_ram_bytes,
            preempt_every=preempt_every or int(os.environ.get(PREEMPT_EVERY, "0") or 0),
            spec_n_max=spec_n_max, max_queue=max_queue, preempt_mode=preempt_mode, context_shift=context_shift)
        self.counters = self.ctx.counters
        self.slots_ = SlotTable(n_slots, self.pool, self.ctx, snapshots_only=runner.recurrent)
        if runner.recurrent:
            states = [*(states or []), RecurrentStates(runner)]
        self.mem = StateManager(self.pool, self.slots_, self.ctx, states)
        self.planner = Planner(runner, self.mem, self.ctx, drafter)
        self.emitter = Emitter(tokenizer, self.mem, self.slots_, self.ctx)
        self.dispatch = dispatch
        self.inbox = Inbox(max_queue)
        self._waiting: Waiting = deque()  # from here on, everything belongs to the compute thread
        self._thread: threading.Thread | None = None
        self.stepper = Stepper(runner, self.planner, self.emitter, self.mem, self.counters,
                               admitting=lambda: bool(self._waiting or self.mem.parked or self.inbox.pending))
        self.snapshot = Snapshot(self.slots_, self.mem, self.ctx)
        self.snapshot.publish(rows=True)

    @property
    def n_ctx_seq(self) -> int:
        return self.ctx.n_ctx_seq

    @n_ctx_seq.setter
    def n_ctx_seq(self, value: int) -> None:
        self.ctx.n_ctx_seq = value
        self.snapshot.publish(rows=True)

    # ------------------------------------------------------------------ public API (any thread)
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine-compute", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.inbox.stop()
        if self._thread:
            self._thread.join(timeout=10)

    def submit(self, req: Request, on_event: Callable[[Event], None]) -> int:
        if not req.prompt:
            raise ValueError("the prompt is empty")
        if len(req.prompt) >= self.n_ctx_seq:
            raise ValueError(f"the prompt has {len(req.prompt)} tokens; the context holds {self.n_ctx_seq} "
                             "per sequence (raise --ctx-size)")
        if req.n < 1 or req.n > len(self.slots_):
            raise ValueError(f"n={req.n} needs between 1 and {len(self.slots_)} slots")
        return self.inbox.submit(req, on_event)

    def cancel(self, request_id: int, index: int | None = None) -> None:
        """Aborts a request, or only its completion `index` (n > 1: one choice hit a stop string)."""
        self.inbox.cancel(request_id, index)

    def call(self, fn: Callable[[Scheduler], object]) -> Future:
        """Runs fn(scheduler) on the compute thread between steps (slot files read and write its caches)."""
        return self.inbox.call(lambda: fn(self))

    def stats(self) -> dict:
        """Counters and pool figures as of the last step, without waiting for a running one."""
        return {**self.snapshot.stats, "queue_len": self.inbox.queued}

    def slots(self) -> list[dict]:
        """`/slots` rows as last published; `want_slots` asks the compute thread for fresh ones."""
        return self.snapshot.rows

    @property
    def slots_version(self) -> int:
        return self.snapshot.version

    def want_slots(self) -> int:
        """Asks for rows published after this call; returns the version to wait past (`slots_version`)."""
        version = self.snapshot.version
        self.snapshot.wanted = True
        self.inbox.poke()
        return version

    # ------------------------------------------------------------------ compute thread
    def _loop(self) -> None:
        while self._wait_for_work():
            t_busy = time.perf_counter()
            with self.inbox.cv:
                arrived, cancels, calls = self.inbox.take()
            for fn, done in calls:
                run_call(fn, done)
            if calls:
                self.snapshot.publish(rows=True)
            self._waiting.extend(arrived)
            if cancels:
                kept = self.emitter.abort(cancels, self._waiting)
                self.inbox.left_queue(len(self._waiting) - len(kept))
                self._waiting = kept
            if not self._recurrent_in_flight():  # admissions and restores may park running sequences
                self.mem.restore_parked()
                before = len(self._waiting)
                self.slots_.admit(self._waiting, self.mem)
                self.inbox.left_queue(before - len(self._waiting))
            try:
                self.stepper.run(self._flush)
            except Exception as e:  # a failed step fails its requests, never the server
                log.exception("step failed")
                self.stepper.ahead = None
                for seq in list(self.mem.running) + list(self.mem.parked):
                    self.emitter.finish(seq, "error", error=str(e))
            if not self.mem.running:  # otherwise the next step's launch hands them over
                self._flush()
            self.counters["busy_seconds_total"] += time.perf_counter() - t_busy

    def _recurrent_in_flight(self) -> bool:
        """A step launched ahead holds rows of a hybrid model's sequences: parking one of them now
        would keep that row's token in its state, though the row is dropped."""
        return self.stepper.ahead is not None and self.runner.recurrent

    def _wait_for_work(self) -> bool:
        """Publishes whatever is asked for while idle; False once stopped."""
        while True:
            with self.inbox.cv:
                while not (self.inbox.stopped or self._has_work() or self.snapshot.wanted):
                    self.inbox.cv.wait(timeout=1.0)
                if self.inbox.stopped:
                    return False
                if self._has_work():
                    return True
            self.snapshot.publish(rows=True)

    def _has_work(self) -> bool:
        return bool(self.inbox.pending or self.mem.running or self.mem.parked or self._waiting or self.stepper.ahead)

    def _flush(self) -> None:
        """Publishes the snapshot, then hands the events so far to the server: a client that reads
        the snapshot after an event sees the state that event came from."""
        self.snapshot.publish()
        batch, self.emitter.outbox = self.emitter.outbox, []
        if batch:
            self.dispatch(batch)
