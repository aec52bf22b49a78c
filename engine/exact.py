"""Exact concurrency: whether it was asked for, whether this launch can honour it, and its report.

A precondition that fails ends the engine (exit 3) with one line naming the mode, what failed and
the flag that fixes it; the studio shows that line and, under `auto`, relaunches without the mode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from contract.env import EXACT, switch
from engine.config import ModelConfig
from engine.exits import EXACT_REFUSED, Fatal, bad_flag
from lockstep_kernels.base import PAGE_SIZE

log = logging.getLogger("engine.exact")

QUANTIZED_KV = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
PREFIX = "exact concurrency: "


def refuse(what: str, fix: str) -> Fatal:
    return Fatal(EXACT_REFUSED, f"{PREFIX}{what}; use {fix}")


def exact_requested(flag: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """The flag decides when given; otherwise the environment twin LOCKSTEP_EXACT=1 asks for it."""
    if flag is not None:
        return flag == "on"
    env = os.environ if environ is None else environ
    try:
        return switch(env, EXACT)
    except ValueError as e:
        raise bad_flag(str(e)) from None


@dataclass
class ExactStatus:
    requested: bool
    granted: bool
    reason: str | None  # why it is off; None when granted
    backend: str
    page_size: int = PAGE_SIZE

    def as_dict(self) -> dict:
        return {"requested": self.requested, "granted": self.granted, "reason": self.reason,
                "page_size": self.page_size, "backend": self.backend}

    def log_line(self) -> str:
        if self.granted:
            return f"{PREFIX}on (backend={self.backend}, page_size={self.page_size})"
        return f"{PREFIX}off ({self.reason})"


def check_launch(*, cache_type_k: str, cache_type_v: str, flash_attn: str, no_kv_offload: bool,
                 backend: str) -> None:
    """Preconditions known from the flags alone, checked before the model is read."""
    for short, kind in (("-ctk", cache_type_k), ("-ctv", cache_type_v)):
        if kind in QUANTIZED_KV:
            raise refuse(f"KV cache type {kind} is not supported", f"{short} f16 (or bf16)")
    if flash_attn == "off":
        raise refuse("flash attention off (-fa off) is not supported: the paged kernel is flash-style",
                     "-fa on")
    if no_kv_offload and backend == "cuda":
        raise refuse("a KV cache kept in host memory (--no-kv-offload) is not supported on CUDA",
                     "the default KV offload (drop -nkvo)")


def check_model(config: ModelConfig, *, gpu_layers: str, backend: str) -> None:
    """Preconditions that need the model: its attention and how many of its layers sit on the GPU.

    `gpu_layers` is "all", "none" or "N of M" as resolved against the model's layer count.
    """
    if backend == "cuda" and gpu_layers not in ("all", "none"):
        raise refuse(f"partial GPU offload (-ngl {gpu_layers} layers) is not supported", "-ngl all")
    if config.sliding_window:
        raise refuse(f"sliding-window attention (window {config.sliding_window}) is not covered by the "
                     "paged kernel", "--exact-concurrency off")
    if config.attn_softcap:
        raise refuse(f"attention soft-capping (cap {config.attn_softcap}) is not covered by the paged kernel",
                     "--exact-concurrency off")


def disable_inexact_features(*, context_shift: bool, cache_reuse: int) -> tuple[bool, int]:
    """Neither survives exact mode; warn and turn off. A context shift cuts a sequence where its context
    ends, so its answer would depend on --ctx-size and --parallel; reused KV at shifted positions has
    keys rotated twice."""
    if context_shift:
        log.warning("exact concurrency: --context-shift disabled (a shift drops tokens where the context ends, "
                    "so the answer would depend on --ctx-size and --parallel)")
    if cache_reuse:
        log.warning("exact concurrency: --cache-reuse %d disabled (reusing KV at shifted positions is not "
                    "exact); prompt caching at the same positions stays on", cache_reuse)
    return False, 0
