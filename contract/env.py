"""Every environment variable Lockstep reads, who reads it, and the one way a switch is parsed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Reader = Literal["engine", "studio", "kernels"]


@dataclass(frozen=True)
class EnvVar:
    name: str
    readers: tuple[Reader, ...]
    doc: str


EXACT = "LOCKSTEP_EXACT"
EXACT_CONCURRENCY = "LOCKSTEP_EXACT_CONCURRENCY"
PREEMPT_MODE = "LOCKSTEP_PREEMPT_MODE"
PREEMPT_EVERY = "LOCKSTEP_PREEMPT_EVERY"
ENGINE_API_KEY = "LLAMA_API_KEY"
API_KEY = "LOCKSTEP_API_KEY"
API_HOST = "LOCKSTEP_API_HOST"
API_PORT = "LOCKSTEP_API_PORT"
CONFIG_DIR = "LOCKSTEP_CONFIG_DIR"
LOG_DIR = "LOCKSTEP_LOG_DIR"
MODEL_DIRS = "LOCKSTEP_MODEL_DIRS"
PDL = "LOCKSTEP_PDL"
DECODE_GRAPHS = "LOCKSTEP_DECODE_GRAPHS"
MATVEC = "LOCKSTEP_MATVEC"
WGMMA_ATTN = "LOCKSTEP_WGMMA_ATTN"
ATTN_WS = "LOCKSTEP_ATTN_WS"
ATTN_WS_LEAN = "LOCKSTEP_ATTN_WS_LEAN"
ATTN_WS_TMA = "LOCKSTEP_ATTN_WS_TMA"
WGMMA_BUILD = "LOCKSTEP_WGMMA_BUILD"
WGMMA_KQ = "LOCKSTEP_WGMMA_KQ"
THREADS = "LLAMA_ARG_THREADS"

REGISTRY: tuple[EnvVar, ...] = (
    EnvVar(EXACT, ("engine", "studio"), "a switch: exact concurrency on when --exact-concurrency is absent; "
           "the studio reads an inherited one as a weak 'on'"),
    EnvVar(EXACT_CONCURRENCY, ("studio",), "auto|on|off: outranks every other exact setting of the studio"),
    EnvVar(PREEMPT_MODE, ("engine", "studio"), "auto|park|recompute: set by the studio for its child"),
    EnvVar(PREEMPT_EVERY, ("engine",), "test knob: park every sequence every N generated tokens"),
    EnvVar(ENGINE_API_KEY, ("engine",), "the engine's api key when --api-key is absent (llama-server's name)"),
    EnvVar(API_KEY, ("studio",), "the studio API's key"),
    EnvVar(API_HOST, ("studio",), "the studio API's host"),
    EnvVar(API_PORT, ("studio",), "the studio API's port"),
    EnvVar(CONFIG_DIR, ("studio",), "where settings.json lives"),
    EnvVar(LOG_DIR, ("studio",), "where engine attempt logs go"),
    EnvVar(MODEL_DIRS, ("studio",), "extra model folders, os.pathsep separated"),
    EnvVar(THREADS, ("engine",), "the CPU threads when -t is absent (llama-server's name); -1 or unset: one per "
           "physical core, at most 8"),
    EnvVar(PDL, ("kernels",), "a switch: programmatic dependent launch on CUDA (default on)"),
    EnvVar(MATVEC, ("kernels",), "a switch: one-row 16-bit matmuls on CUDA take matvec.cu's ring kernel, the "
           "bits of matmul.cu's one-row kernel (default off: not yet measured on a device)"),
    EnvVar(WGMMA_ATTN, ("kernels",), "a switch: prefill attention of 16-bit caches on Hopper takes attention_wgmma.cu "
           "(attn_mma's arithmetic on wgmma, its bits; default on for sm_90, 0 keeps attn_mma; other GPUs always "
           "keep attn_mma)"),
    EnvVar(ATTN_WS, ("kernels",), "a switch: attention_wgmma.cu's two-warpgroup prefills take attention_ws.cu "
           "(the same bits, warp-specialised: a producer warpgroup, mbarrier ring, ping-pong consumers; default on where attention_wgmma.cu runs, 0 keeps attention_wgmma.cu)"),
    EnvVar(ATTN_WS_LEAN, ("kernels",), "a switch: attention_ws.cu's lean build (plan.WGMMA_WS_LEAN, _FTZ, _VEC_FOLD "
           "and _SKIP_MASK at once: fewer instructions a sub-tile, the same bits; default on, 0 turns it off)"),
    EnvVar(ATTN_WS_TMA, ("kernels",), "a switch: the lean attention_ws.cu build brings K/V sub-tiles by TMA "
           "(the same swizzled tiles, the same bits; default plan.WGMMA_WS_TMA)"),
    EnvVar(WGMMA_KQ, ("kernels",), "a switch: Q4_K and Q6_K prefills on Hopper take wgmma_kq.cu (mm_tc's sums on "
           "the warpgroup MMA, its bits; unset: plan.WGMMA_KQ)"),
    EnvVar(WGMMA_BUILD, ("kernels",), "tiles|persist|g3|g3p|mc|mcp|g3mc: the build of the exact prefill matmul on Hopper "
           "(mm_wgmma_tma, the same bits in each; lockstep_kernels/cuda/plan.py WGMMA_BUILDS; default g3p)"),
    EnvVar(DECODE_GRAPHS, ("engine",), "a switch: decode steps replay CUDA graphs (default on; off: every step "
           "launched from Python, for comparisons)"),
)

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def parse_switch(value: str | None, default: bool = False) -> bool:
    """The one reading of a boolean variable: 1/on/true/yes and 0/off/false/no (any case); unset or
    empty gives `default`; anything else is an error that names the accepted words."""
    text = (value or "").strip().lower()
    if not text:
        return default
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ValueError(f"{value!r} is not a switch (use one of {', '.join(_ON)} or {', '.join(_OFF)})")


def switch(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    try:
        return parse_switch(env.get(name), default)
    except ValueError as e:
        raise ValueError(f"{name}={env.get(name)!r} is not a switch (use 1/on/true/yes or 0/off/false/no)") from e
