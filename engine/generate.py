"""`lockstep-engine generate`: one completion from the command line, streamed to stdout.

It runs the same scheduler the server runs (one slot), so its tokens are the server's tokens.
"""

from __future__ import annotations

import argparse
import logging
import queue
import sys

from engine.device import resolve_device
from engine.exact import exact_requested
from engine.launch import build_runner, pool_pages, read_model
from engine.requests import DoneEvent, Request
from engine.sampler import SamplingParams, random_seed
from engine.scheduler import Scheduler
from engine.textstream import TextStream
from lockstep_kernels.base import PAGE_SIZE

log = logging.getLogger("engine.generate")


def run_generate(opts: argparse.Namespace) -> int:
    device = resolve_device(opts.device)
    exact = exact_requested(opts.exact_concurrency)
    loaded = read_model(opts.model, None)
    n_pages = pool_pages(opts.ctx_size, loaded.config)
    runner = build_runner(loaded, device, exact, n_pages, "f32" if device == "cpu" else "f16", n_pages,
                          threads=opts.threads)
    scheduler = Scheduler(runner, loaded.tokenizer, n_slots=1, n_ctx=n_pages * PAGE_SIZE, n_batch=2048,
                          n_ubatch=512, kv_unified=True, preempt_ram_bytes=0)
    tok = loaded.tokenizer
    prompt = tok.encode(opts.prompt, add_special=True)
    seed = opts.seed if opts.seed >= 0 else random_seed()
    params = SamplingParams(temperature=max(opts.temp, 0.0), seed=seed)
    events: queue.Queue = queue.Queue()
    scheduler.start()
    try:
        scheduler.submit(Request(prompt, params, opts.n_predict), events.put)
        stream = TextStream(tok)
        while True:
            ev = events.get()
            if isinstance(ev, DoneEvent):
                sys.stdout.write(stream.finish().text + "\n")
                sys.stdout.flush()
                t = ev.timings or {}
                log.info("finish_reason=%s seed=%d prompt_tokens=%d completion_tokens=%d decode %.1f tok/s",
                         ev.finish_reason, seed, ev.prompt_tokens, ev.completion_tokens,
                         t.get("predicted_per_second", 0.0))
                return 0 if ev.finish_reason in ("stop", "length") else 1
            sys.stdout.write(stream.push(ev.token).text)
            sys.stdout.flush()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        scheduler.stop()
