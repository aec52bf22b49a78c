"""The server's options, frozen: made once from the parsed command line and its environment, then
only read (a later decision, such as exact mode turning features off, makes a new copy)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Literal

from engine.modes import PreemptMode

OnOffAuto = Literal["on", "off", "auto"]
Device = Literal["auto", "cuda", "cpu"]
SpecType = Literal["none", "ngram", "draft-simple"]


@dataclass(frozen=True)
class EngineArgs:
    model: str
    alias: str | None
    host: str
    port: int
    ctx_size: int
    parallel: int
    batch_size: int
    ubatch_size: int
    kv_unified: bool
    flash_attn: OnOffAuto
    n_gpu_layers: str | int
    no_kv_offload: bool
    cache_type_k: str
    cache_type_v: str
    context_shift: bool
    cache_reuse: int
    spec_type: SpecType
    spec_draft_n_max: int
    model_draft: str | None
    n_gpu_layers_draft: str | None
    seed: int
    api_key: str | None  # from --api-key, --api-key-file or LLAMA_API_KEY
    api_key_file: str | None
    metrics: bool
    jinja: bool
    chat_template_file: str | None
    device: Device
    preempt_ram: int
    exact_concurrency: Literal["on", "off"] | None
    body_limit: int
    timeout: int
    max_connections: int
    cors_origins: str
    # llama-server flags accepted for compatibility (engine.cli_compat)
    temp: float | None
    n_predict: int
    threads: int  # resolved: -t, else LLAMA_ARG_THREADS, else the physical cores (engine.threads)
    threads_batch: int | None
    cont_batching: bool
    slots_endpoint: bool
    tags: list[str]
    no_jinja: bool
    chat_template_name: str | None
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy", "auto"]
    reasoning: OnOffAuto
    no_webui: bool
    verbose: bool
    slot_save_path: str | None
    cache_ram: int | None
    swa_full: bool
    sleep_idle_seconds: int
    keep: int
    spec_draft_n_min: int
    backend_sampling: bool
    # several GPUs (engine.parallel): tp and tp_split are resolved from --tp, --split-mode and -ts
    split_mode: Literal["none", "layer", "row"] | None
    tensor_split: tuple[float, ...] | None
    main_gpu: int
    tp: int
    tp_split: tuple[float, ...]  # one normalised-or-not proportion per rank
    chat_template: str | None  # the text of --chat-template-file or of the named built-in
    preempt_mode: PreemptMode  # LOCKSTEP_PREEMPT_MODE
    threads_source: str = "-t"  # where `threads` came from, for the load log

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **derived) -> EngineArgs:
        """Every field from the parsed flags or `derived`; a flag without a field is an error here,
        not a silently dropped option."""
        values = {**vars(ns), **derived}
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise TypeError(f"EngineArgs has no field for {', '.join(sorted(unknown))}")
        return cls(**values)
