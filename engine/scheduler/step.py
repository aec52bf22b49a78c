"""One step: plan it (or take the one launched ahead), launch it, maybe launch the next one ahead,
and hand each row's logits back to its sequence."""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.runner import Pending, Runner
from engine.scheduler.emitter import Emitter
from engine.scheduler.memory import StateManager
from engine.scheduler.planner import Plan, Planner


class Stepper:
    def __init__(self, runner: Runner, planner: Planner, emitter: Emitter, mem: StateManager, counters: dict,
                 admitting: Callable[[], bool]):
        """`admitting()`: whether requests wait to be admitted or restored (a hybrid model's
        sequences are then not launched ahead, see `run`)."""
        self.runner, self.planner, self.emitter, self.mem = runner, planner, emitter, mem
        self.counters = counters
        self.admitting = admitting
        # a decode step launched before the previous step's tokens reached the host (Planner.plan_ahead)
        self.ahead: tuple[Plan, Pending] | None = None

    def run(self, flush: Callable[[], None]) -> None:
        """`flush()` hands the events so far to the server; it runs while the device computes."""
        t0 = time.perf_counter()
        ahead = self.ahead is not None
        if ahead:
            (plan, pending), self.ahead = self.ahead, None
        else:
            plan = self.planner.plan()
            if not plan:
                flush()
                return
            for seq, _ in plan:
                if seq.generated == 0 and seq.n_computed == seq.cached_tokens:
                    self.emitter.progress(seq)  # before its first chunk: what the cache already holds
            pending = self.runner.launch([e for _, e in plan])
        # a hybrid model's sequences are parked only between steps that have no step in flight: none
        # is launched ahead while requests wait to be admitted or restored
        admitting = self.runner.recurrent and self.admitting()
        nxt = None if admitting else self.planner.plan_ahead(plan, ahead)
        if nxt:
            self.ahead = nxt, self.runner.launch_ahead(pending, [e for _, e in nxt])
            self.counters["ahead_steps_total"] += 1
        # The previous step's tokens go out while the device runs this one: the server's work on
        # them (sharing the GIL) then overlaps the step instead of delaying its launch.
        flush()
        results = pending.collect()
        self._count(plan, time.perf_counter() - t0)
        for (seq, entry), logits in zip(plan, results, strict=True):
            if ahead and (seq.done or not self.mem.is_running(seq)):
                continue  # ended, cancelled or parked after this step was launched: its row is dropped
            if seq.draft:
                self.emitter.verify(seq, logits)
                continue
            seq.n_computed += len(entry.tokens)
            self.emitter.progress(seq)
            if logits is not None and not seq.done:
                self.emitter.on_logits(seq, logits.row(-1))

    def _count(self, plan: Plan, took: float) -> None:
        c = self.counters
        c["step_seconds_total"] += took
        c["steps_total"] += 1
        if all(len(e.tokens) == 1 for _, e in plan):
            c["decode_step_seconds_total"] += took
            c["decode_steps_total"] += 1
            c["decode_rows_total"] += len(plan)
