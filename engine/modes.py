"""The engine's named states and modes, as types (light: the command line imports it)."""

from __future__ import annotations

from typing import Literal, get_args

# auto: park to host memory within the parking budget, recompute past it; park: the budget is the
# host's available memory; recompute: never use host memory (drop the KV, recompute it later)
PreemptMode = Literal["auto", "park", "recompute"]
PREEMPT_MODES: tuple[str, ...] = get_args(PreemptMode)
# which logits rows of a step entry reach the sampler: its last row, every row (draft verification), none
LogitRows = Literal["last", "all", "none"]
