"""The launch sequence: device, exact-mode preconditions, bind, load (model_load.py), serve until a signal.

The port is bound before the model loads so that a supervisor polling /health sees 503 (loading)
and then 200, and learns at once when the port is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from dataclasses import replace

from aiohttp import web

from engine.args import EngineArgs
from engine.cli import check_supported
from engine.device import resolve_device
from engine.draft_model import check_path
from engine.exact import ExactStatus, check_launch, disable_inexact_features, exact_requested
from engine.exits import CANNOT_BIND, Fatal, bad_flag
from engine.server.app import build_app
from engine.server.errors import ApiError
from engine.server.model_load import load_model
from engine.server.protocol import GuardedRunner
from engine.server.sleep import Sleeper
from engine.server.state import EngineState
from lockstep_kernels.base import PAGE_SIZE

log = logging.getLogger("engine.server")

SHUTDOWN_SECONDS = 1.0  # what open requests get, once told to end, before their connections are cut
FORCED_EXIT_SECONDS = 5.0  # a shutdown still running then ends the process regardless
# How long the event loop may wait for the GIL while the compute thread or a worker holds it (Python's
# default is 5 ms, paid at each of a request's wake-ups): /health's latency under load.
GIL_SWITCH_S = 0.001


def serve(opts: EngineArgs) -> int:
    sys.setswitchinterval(GIL_SWITCH_S)
    return asyncio.run(_serve(opts))


def resolve_backend(opts: EngineArgs) -> str:
    if opts.n_gpu_layers == 0:
        if opts.device == "cuda":
            raise bad_flag("--device cuda with -ngl 0 puts no layer on the GPU; use -ngl all, or --device cpu")
        log.info("-ngl 0: no layers on the GPU, using the CPU backend")
        return "cpu"
    return resolve_device(opts.device)


def resolve_exact(opts: EngineArgs, backend: str) -> tuple[ExactStatus, EngineArgs]:
    """Exact mode's status, and the options with the features it turns off turned off."""
    if not exact_requested(opts.exact_concurrency):
        return ExactStatus(False, False, "not requested", backend), opts
    check_launch(cache_type_k=opts.cache_type_k, cache_type_v=opts.cache_type_v, flash_attn=opts.flash_attn,
                 no_kv_offload=opts.no_kv_offload, backend=backend)
    shift, reuse = disable_inexact_features(context_shift=opts.context_shift, cache_reuse=opts.cache_reuse)
    return ExactStatus(True, True, None, backend), replace(opts, context_shift=shift, cache_reuse=reuse)


async def _serve(opts: EngineArgs) -> int:
    backend = resolve_backend(opts)
    exact, opts = resolve_exact(opts, backend)
    check_supported(opts, backend)
    if opts.model_draft:
        check_path(opts.model_draft)
    if opts.cache_type_k != opts.cache_type_v and backend == "cuda":
        raise bad_flag(f"-ctk {opts.cache_type_k} with -ctv {opts.cache_type_v}: different K and V cache types "
                       "are not supported on CUDA yet")
    state = EngineState(opts, exact, backend)
    if opts.sleep_idle_seconds > 0:
        loop = asyncio.get_running_loop()
        state.sleeper = Sleeper(state, opts.sleep_idle_seconds, lambda: load_model(state, loop))
    log.info(exact.log_line())
    log.info("CPU threads: %d (%s)", opts.threads, opts.threads_source)
    runner = GuardedRunner(build_app(state), opts.max_connections, handler_cancellation=True, access_log=None,
                           shutdown_timeout=SHUTDOWN_SECONDS, keepalive_timeout=opts.timeout)
    await runner.setup()
    stop = _stop_on_signals()
    try:
        port = await _bind(runner, opts.host, opts.port)
        log.info("listening on http://%s:%d (loading %s)", opts.host, port, opts.model)
        if await _load_unless_stopped(state, stop):
            log.info("model loaded: %s; server is ready (slots=%d, n_ctx=%d, n_ctx_seq=%d, pages=%d)",
                     state.alias, opts.parallel, state.n_ctx, state.scheduler.n_ctx_seq, state.n_ctx // PAGE_SIZE)
            watch = asyncio.ensure_future(state.sleeper.watch()) if state.sleeper is not None else None
            await stop.wait()
            if watch is not None:
                watch.cancel()
        log.info("shutting down")
        return 0
    finally:
        _end_requests(state)
        await runner.cleanup()
        if state.scheduler is not None:
            state.scheduler.stop()


def _end_requests(state: EngineState) -> None:
    """Every running request ends now: a stream with an error event, any other with a 503; leaving the
    generation cancels its scheduler request, which frees its pages."""
    state.stopping = True
    for gen in list(state.generations):
        gen.abort(ApiError(503, "server is shutting down"))


async def _bind(runner: web.AppRunner, hosts: str, port: int) -> int:
    """Binds each of the comma-separated addresses (llama-server's --host a,b); port 0 takes the first one's."""
    for host in [h.strip() for h in hosts.split(",") if h.strip()]:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            raise Fatal(CANNOT_BIND, f"error: cannot bind {host}:{port}: {e.strerror or e}") from None
        sockets = site._server.sockets if site._server else []  # the real port when 0 was asked for
        port = sockets[0].getsockname()[1] if sockets else port
    return port


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if not stop.is_set():
            stop.set()
            threading.Thread(target=_forced_exit, name="engine-exit", daemon=True).start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    return stop


def _forced_exit() -> None:
    threading.Event().wait(FORCED_EXIT_SECONDS)
    log.warning("shutdown still running after %g s: exiting now", FORCED_EXIT_SECONDS)
    logging.shutdown()
    os._exit(0)


async def _load_unless_stopped(state: EngineState, stop: asyncio.Event) -> bool:
    """Loads on a daemon thread, so that a stop during a long load exits at once instead of waiting it out."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def work() -> None:
        try:
            load_model(state, loop)
            result = None
        except BaseException as e:  # handed to the loop, which raises it (a Fatal carries the exit code)
            result = e
        with contextlib.suppress(RuntimeError):  # the loop already closed: we were stopped
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(result))

    threading.Thread(target=work, name="engine-load", daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([done, stopped], return_when=asyncio.FIRST_COMPLETED)
    if not done.done():
        return False
    stopped.cancel()
    if done.result() is not None:
        raise done.result()
    return True
