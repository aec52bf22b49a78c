"""What a client submits to the scheduler and the events it gets back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.sampler import SamplingParams


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    n: int = 1
    logprobs: int = -1
    cache_prompt: bool = True
    id_slot: int = -1
    return_progress: bool = False  # a ProgressEvent when admitted and after each prompt chunk
    # --context-shift: the first n_keep tokens stay (-1: the whole prompt); n_discard go (0: half the rest)
    n_keep: int = 0
    n_discard: int = 0


@dataclass
class TokenEvent:
    index: int
    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None


@dataclass
class ProgressEvent:
    index: int
    total: int  # prompt tokens
    cache: int  # of them reused from the prompt cache
    processed: int  # of them with KV so far, cached ones included


@dataclass
class DoneEvent:
    index: int
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    parks: int
    restores: int
    timings: dict
    error: str | None = None


class QueueFullError(Exception):
    pass


def call_each(batch: list[tuple[Callable, object]]) -> None:
    for callback, event in batch:
        callback(event)


Event = TokenEvent | DoneEvent | ProgressEvent
Row = tuple[np.ndarray | None, int]  # a logits row on the host (when the sampler needs it) and its argmax
