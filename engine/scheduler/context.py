"""What the scheduler's parts share: its limits, its counters and one order clock."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.modes import PreemptMode

COUNTERS = ("parks", "restores", "recomputes", "requests_total", "prompt_tokens_total", "tokens_predicted_total",
            "drafted_total", "draft_accepted_total", "steps_total", "decode_steps_total", "ahead_steps_total",
            "decode_rows_total", "drafts_total", "context_shifts")
TIMERS = ("step_seconds_total", "decode_step_seconds_total", "busy_seconds_total")


def new_counters() -> dict:
    return dict.fromkeys(COUNTERS, 0) | dict.fromkeys(TIMERS, 0.0)


@dataclass
class Context:
    n_ctx_seq: int  # most positions one sequence may use
    budget: int  # tokens per step
    preempt_ram_bytes: int  # host memory for parked KV; past it a preempted sequence is recomputed
    preempt_every: int  # test knob: park every sequence every N generated tokens
    spec_n_max: int
    max_queue: int
    preempt_mode: PreemptMode = "auto"
    context_shift: bool = False  # a sequence that fills n_ctx_seq drops old tokens instead of ending
    counters: dict = field(default_factory=new_counters)
    # admission order of sequences (the newest is parked first) and use order of slots (LRU caches)
    clock: Iterator[int] = field(default_factory=itertools.count)

    def tick(self) -> int:
        return next(self.clock)


def available_host_bytes() -> int:
    """Memory the host has free now (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
