"""A sequence's state in the scheduler, and the slots that hold sequences and prompt caches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.kv_cache import ParkedKV
from engine.requests import Event, Request
from engine.sampler import SamplingParams
from engine.speculative import DraftState


@dataclass(eq=False)
class Seq:
    req_id: int
    index: int
    req: Request
    on_event: Callable[[Event], None]
    params: SamplingParams
    tokens: list[int]
    n_prompt: int
    admitted: int  # admission order; the newest running sequence is parked first
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    n_computed: int = 0
    generated: int = 0
    parked: ParkedKV | None = None  # host copy while parked; None while parked means recompute
    is_parked: bool = False
    parks: int = 0
    restores: int = 0
    cached_tokens: int = 0
    done: bool = False
    t_start: float = 0.0
    t_first: float = 0.0
    draft: list[int] = field(default_factory=list)
    spec: DraftState | None = None
    # hybrid models (engine.recurrent_state): the recurrent state while running, its snapshots at
    # prompt chunk ends {position: host copy}, and the prompt-cache snapshot it starts from
    state: object = None
    snapshots: dict = field(default_factory=dict)
    resume: list | None = None

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.n_computed


@dataclass
class Slot:
    id: int
    seq: Seq | None = None
    cache_tokens: list[int] = field(default_factory=list)  # prompt cache: KV of these sits in cache_pages
    cache_pages: list[int] = field(default_factory=list)
    cache_states: dict = field(default_factory=dict)  # hybrid models: state snapshots of the cached prompt
    n_preempt: int = 0
    n_restore: int = 0
    last_used: int = 0
    reserved: int = 0  # a request id whose further n > 1 completions will take this slot


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
