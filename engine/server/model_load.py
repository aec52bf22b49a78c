"""The load-thread work: read the model, check what needs it, size the pool, self-check and warm up,
start the scheduler; the tensor-parallel plan and each slot's context.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engine import load_progress
from engine.args import EngineArgs
from engine.draft_model import load_draft
from engine.exact import check_model
from engine.exits import bad_flag
from engine.kv_cache import pages_for, seq_context
from engine.launch import build_runner, gpu_layers, pool_pages, read_model
from engine.scheduler import Scheduler
from engine.selfcheck import self_check
from engine.server.generation import LoopDispatch
from engine.server.state import EngineState
from engine.threads import threads_report
from engine.warmup import warm_up
from lockstep_kernels.base import PAGE_SIZE
from lockstep_kernels.weights import QK8_0

log = logging.getLogger("engine.server")

MAX_QUEUE = 64


def load_model(state: EngineState, loop: asyncio.AbstractEventLoop) -> None:
    """Load-thread work: read the model, check what needs it, size the pool, start the scheduler."""
    opts = state.opts
    load_progress.phase("read")
    t0 = time.perf_counter()
    loaded = read_model(opts.model, opts.chat_template)
    config = loaded.config
    layers = gpu_layers(opts.n_gpu_layers, config.n_layers) if state.backend == "cuda" else "none"
    if state.exact.requested:
        check_model(config, gpu_layers=layers, backend=state.backend)
    if state.backend == "cuda" and layers != "all":
        raise bad_flag(f"-ngl {opts.n_gpu_layers}: partial GPU offload ({layers} layers) is not supported "
                       "yet; use -ngl all, or -ngl 0 for the CPU backend")
    for flag, kind in (("-ctk", opts.cache_type_k), ("-ctv", opts.cache_type_v)):
        if kind == "q8_0" and config.head_dim % QK8_0:
            raise bad_flag(f"{flag} q8_0 needs a head dimension divisible by {QK8_0}; this model's is "
                           f"{config.head_dim} (use {flag} f16)")
    n_pages = pool_pages(opts.ctx_size, config)
    seq_pages = pages_for(seq_context(n_pages * PAGE_SIZE, opts.parallel, opts.kv_unified, n_pages * PAGE_SIZE))
    plan = parallel_plan(opts, loaded, state.backend)
    runner = build_runner(loaded, state.backend, state.exact.granted, n_pages, opts.cache_type_k, seq_pages,
                          opts.ubatch_size, opts.cache_type_v, n_seqs=opts.parallel,
                          threads=opts.threads, plan=plan)
    load_progress.phase("warmup")  # the exactness self-check, the kernels' warm-up, the scheduler's start
    t_weights = time.perf_counter()
    spec_n = opts.spec_draft_n_max if opts.spec_type != "none" or opts.model_draft else 0
    check_builds = 0.0  # of the self-check's seconds, kernels built on first use (the warm-up's otherwise)
    if state.exact.granted:  # each rank's shards: their shapes are the ones its matmuls see
        for ops, model in runner.model.rank_models() if plan is not None else [(runner.ops, runner.model)]:
            check_builds += self_check(ops, model, opts.ubatch_size, head_rows=opts.parallel * (spec_n + 1),
                                       kv_type=opts.cache_type_k, width=seq_pages)
    if plan is not None:
        state.parallel = {"tp": plan.tp, "split_mode": "row", "split": list(plan.split),
                          "kv_heads": [s.n_kv_heads for s in plan.ranks], "devices": list(plan.devices)}
    if spec_n and runner.recurrent:
        log.warning("speculative drafting is off for %s: a rejected draft would need the recurrent state rolled "
                    "back", config.arch)
        spec_n = 0
    t_check = time.perf_counter()
    # every kernel built before /health turns ready: the first request runs at full speed
    warm = warm_up(runner, opts.ubatch_size, prompts=state.backend == "cuda")
    t_end = time.perf_counter()
    state.load_seconds = {"weights": round(t_weights - t0, 3), "self_check": round(t_check - t_weights, 3),
                          "self_check_builds": round(check_builds, 3),
                          "warm_up": round(t_end - t_check, 3), "warm_up_prompt_rows": warm["prompt_rows"],
                          "warm_up_graphs": warm["buckets"]}
    log.info("load: weights %.2f s, self-check %.2f s (%.2f s of it kernel builds), warm-up %.2f s", t_weights - t0,
             t_check - t_weights, check_builds, t_end - t_check)
    drafter = None
    if spec_n and opts.model_draft:
        draft = load_draft(opts, loaded, state.backend, seq_pages, opts.threads)
        drafter = lambda seq, k: draft.propose(seq.slot, seq.tokens, k)  # noqa: E731
        log.info("speculative drafts from the draft model %s (%s, up to %d tokens)", opts.model_draft,
                 draft.runner.config.arch, spec_n)
    scheduler = Scheduler(runner, loaded.tokenizer, n_slots=opts.parallel, n_ctx=n_pages * PAGE_SIZE,
                          n_batch=opts.batch_size, n_ubatch=opts.ubatch_size, kv_unified=opts.kv_unified,
                          preempt_ram_bytes=opts.preempt_ram << 20, max_queue=MAX_QUEUE,
                          spec_n_max=spec_n,
                          dispatch=LoopDispatch(loop), preempt_mode=opts.preempt_mode,
                          context_shift=_context_shift(opts, runner), drafter=drafter)
    _cap_slot_context(scheduler, opts, config)
    if config.sliding_window and scheduler.n_ctx_seq > config.sliding_window:
        # the model code attends to every earlier position; within the window that is the same thing
        log.warning("the model uses sliding-window attention (window %d), which the engine does not apply: "
                    "each sequence is limited to %d positions", config.sliding_window, config.sliding_window)
        scheduler.n_ctx_seq = config.sliding_window
    if opts.chat_template_file:
        loaded.tokenizer.template.origin = f"the chat template from --chat-template-file {opts.chat_template_file}"
    state.max_token_bytes = max_token_bytes(loaded.tokenizer)
    state.cpu_threads = threads_report()
    state.loaded, state.n_ctx = loaded, n_pages * PAGE_SIZE
    scheduler.start()
    state.scheduler = scheduler  # last: the server reports ready from here on


def _context_shift(opts: EngineArgs, runner) -> bool:
    if opts.context_shift and runner.recurrent:  # as llama-server: a recurrent state cannot drop old tokens
        log.warning("--context-shift disabled: %s keeps a recurrent state, from which tokens cannot be dropped",
                    runner.config.arch)
        return False
    return opts.context_shift


def parallel_plan(opts: EngineArgs, loaded, backend: str):
    """The tensor-parallel plan of --tp/-ts/-mg for this model, or None for one rank."""
    if opts.tp <= 1:
        if opts.main_gpu and backend == "cuda":
            raise bad_flag(f"--main-gpu {opts.main_gpu} with one GPU is not supported yet (it picks rank 0's GPU with "
                           "--tp > 1); use CUDA_VISIBLE_DEVICES to pick the GPU")
        return None
    from engine.parallel.plan import PlanError
    from engine.parallel.setup import tp_plan

    try:
        plan = tp_plan(loaded.config, loaded.weights, backend, opts.tp, opts.tp_split, opts.main_gpu)
    except PlanError as e:
        raise bad_flag(str(e)) from None
    log.info("tensor parallel: %d ranks on %s, KV heads per rank %s, FFN columns per rank %s", plan.tp,
             "devices " + ",".join(map(str, plan.devices)) if backend == "cuda" else "the CPU",
             [s.n_kv_heads for s in plan.ranks], [s.ffn for s in plan.ranks])
    return plan


def max_token_bytes(tokenizer) -> int:
    """The longest vocabulary entry in UTF-8 bytes (byte-level BPE spells a byte as one character, which is at
    most two bytes: an over-estimate, which only makes the text-length bound on prompts more lenient)."""
    return max((len(piece.encode("utf-8", "surrogatepass")) for piece in tokenizer.tok.get_vocab()), default=1)


def _cap_slot_context(scheduler: Scheduler, opts: EngineArgs, config) -> None:
    """A slot gets what llama-server would give it, -c / -np, never the extra that rounding the pool up to
    whole pages left; below one page per slot the launch is refused, naming the flags."""
    if opts.kv_unified:
        return
    requested = opts.ctx_size or config.max_position
    share = requested // opts.parallel
    if share < PAGE_SIZE:
        raise bad_flag(f"-c {requested} with -np {opts.parallel} gives each slot {share} tokens, less than one "
                       f"{PAGE_SIZE}-token KV page; use -c {PAGE_SIZE * opts.parallel} or more, a smaller -np, "
                       "or -kvu (one pool shared by the slots)")
    scheduler.n_ctx_seq = min(scheduler.n_ctx_seq, share)
