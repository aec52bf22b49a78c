"""Spawning the engine child and the relaunch ladder.

One attempt = one child, one port, one log file. An attempt ends ready (GET /health answered 200),
or failed: it exited first, or the deadline passed. A failure is classified and the ladder decides
whether a changed command line is worth another attempt (at most MAX_ATTEMPTS in all).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import os
import secrets
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from contract import PAGE_SIZE
from contract import env as env_names
from settings import ENV_EXACT_INHERITED, ENV_PREEMPT
from studio.failures import Failure, classify
from studio.flags import Options, Owned, compose_argv, redact_argv

MAX_ATTEMPTS = 4
STOP_GRACE_S = 10.0
HEALTH_POLL_S = 0.1
KEEP_LOGS = 200
ENGINE_CMD: tuple[str, ...] = (sys.executable, "-m", "engine")
# The engine reads its key from here, as llama-server does: an environment is private to the user, argv is not.
ENV_ENGINE_KEY = env_names.ENGINE_API_KEY
ENV_STUDIO_KEY = env_names.API_KEY
# Process-wide, so two loads within one second never share a log file whichever Launcher runs them.
_LOAD_SERIAL = itertools.count(1)


def child_env(base: Mapping[str, str], exact: bool, preempt_mode: str, api_key: str | None = None
              ) -> dict[str, str]:
    """The child's environment: the studio's, with the exact switch set or removed, the preempt mode and
    the child's own api key (the studio's key is not the child's business)."""
    env = dict(base)
    env.pop(ENV_STUDIO_KEY, None)
    env.pop(ENV_ENGINE_KEY, None)
    if api_key:
        env[ENV_ENGINE_KEY] = api_key
    env.pop(ENV_EXACT_INHERITED, None)  # exact off must not be overturned by an inherited LOCKSTEP_EXACT=1
    if exact:
        env[ENV_EXACT_INHERITED] = "1"
    env[ENV_PREEMPT] = preempt_mode
    env["PYTHONUNBUFFERED"] = "1"  # the attempt log must hold the engine's last line when it dies
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LaunchPlan:
    model_path: str
    alias: str
    parallel: int
    options: Options
    exact_mode: str  # the resolved request: auto, on or off
    preempt_mode: str
    native_context: int | None = None


@dataclass
class Attempt:
    number: int
    argv: list[str]  # redacted
    exact: bool
    port: int
    log_path: str
    change: str | None  # why this attempt's command line differs from the previous one
    outcome: str = "running"  # "ready" or a failure kind
    failure: Failure | None = None
    message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "argv": self.argv,
            "exact": self.exact,
            "port": self.port,
            "log": self.log_path,
            "change": self.change,
            "outcome": self.outcome,
            "failure": self.failure.as_dict() if self.failure else None,
            "message": self.message,
        }


@dataclass
class EngineChild:
    process: asyncio.subprocess.Process
    host: str
    port: int
    api_key: str
    argv: list[str]  # redacted
    exact: bool  # launched with --exact-concurrency on
    env_exact: bool  # LOCKSTEP_EXACT=1 in its environment
    props: dict[str, Any]
    log_path: str

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


@dataclass
class LaunchResult:
    child: EngineChild
    attempts: list[Attempt]
    options: Options  # after the ladder's changes
    exact_dropped: Failure | None = None  # under auto: the failure that made the ladder drop exact


class LaunchFailed(Exception):
    def __init__(self, message: str, failure: Failure, attempts: list[Attempt]) -> None:
        super().__init__(message)
        self.message = message
        self.failure = failure
        self.attempts = attempts


@dataclass
class _Step:
    options: Options
    exact: bool
    change: str
    drops_exact: bool = False


@dataclass
class Launcher:
    log_dir: Path
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    engine_cmd: Sequence[str] = ENGINE_CMD
    host: str = "127.0.0.1"
    health_timeout_s: float = 180.0
    max_attempts: int = MAX_ATTEMPTS
    on_attempt: Callable[[Attempt], None] | None = None  # told as each attempt starts (live progress)

    async def launch(self, plan: LaunchPlan) -> LaunchResult:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _prune_logs(self.log_dir)
        load_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_LOAD_SERIAL)}"
        options = dict(plan.options)
        exact = plan.exact_mode in ("on", "auto")
        attempts: list[Attempt] = []
        dropped: Failure | None = None
        change: str | None = None
        failure: Failure | None = None
        for number in range(1, self.max_attempts + 1):
            child, attempt = await self._attempt(load_id, number, plan, options, exact, change)
            attempts.append(attempt)
            if child is not None:
                return LaunchResult(child, attempts, options, dropped)
            failure = attempt.failure
            assert failure is not None
            step = next_step(plan, options, exact, failure)
            if isinstance(step, str):
                attempt.message = step
                raise LaunchFailed(step, failure, attempts)
            attempt.message = step.change
            if step.drops_exact:
                dropped = failure
            options, exact, change = step.options, step.exact, step.change
        assert failure is not None
        message = f"gave up after {self.max_attempts} attempts; the last failed with: {failure.detail}"
        raise LaunchFailed(message, failure, attempts)

    async def _attempt(
        self, load_id: str, number: int, plan: LaunchPlan, options: Options, exact: bool, change: str | None
    ) -> tuple[EngineChild | None, Attempt]:
        port = free_port(self.host)
        api_key = secrets.token_hex(24)  # hex: a key starting with "-" would read as a flag
        owned = Owned(plan.model_path, plan.alias, self.host, port, plan.parallel)
        argv = compose_argv(owned, options, exact)
        shown = redact_argv(argv)
        log_path = self.log_dir / f"engine-{load_id}-attempt{number}.log"
        attempt = Attempt(number, shown, exact, port, str(log_path), change)
        if self.on_attempt is not None:
            self.on_attempt(attempt)
        env = child_env(self.base_env, exact, plan.preempt_mode, api_key)
        with open(log_path, "ab") as log:
            header = [f"# lockstep attempt {number} of at most {self.max_attempts}"]
            if change:
                header.append(f"# change: {change}")
            header.append("# argv: " + shlex.join([*self.engine_cmd, *shown]))
            header.append(f"# env: {ENV_EXACT_INHERITED}={env.get(ENV_EXACT_INHERITED, '(unset)')} "
                          f"{ENV_PREEMPT}={env[ENV_PREEMPT]}")
            log.write(("\n".join(header) + "\n").encode())
            log.flush()
            output_start = log.tell()
            process = await asyncio.create_subprocess_exec(
                *self.engine_cmd, *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=asyncio.subprocess.STDOUT, env=env, preexec_fn=_die_with_parent,
            )
        child = EngineChild(process, self.host, port, api_key, shown, exact,
                            env.get(ENV_EXACT_INHERITED) == "1", {}, str(log_path))
        try:
            state = await wait_healthy(child, time.monotonic() + self.health_timeout_s)
            if state == "ready":
                child.props = await fetch_json(child, "/props") or {}
        except BaseException:  # cancelled (unload, shutdown): no child may outlive its attempt untracked
            await stop_process(process)
            raise
        if state == "ready":
            attempt.outcome = "ready"
            return child, attempt
        if state == "timeout":
            await stop_process(process)
            failure = Failure("timeout", process.returncode, None,
                              f"the engine did not answer /health within {self.health_timeout_s:g} s")
        else:
            failure = classify(_read_from(log_path, output_start), process.returncode)
        attempt.outcome, attempt.failure = failure.kind, failure
        return None, attempt


def next_step(plan: LaunchPlan, options: Options, exact: bool, failure: Failure) -> _Step | str:
    """The ladder: the changed launch to try after `failure`, or the final message when there is none."""
    if failure.kind == "exact_refusal":
        if exact and plan.exact_mode == "auto":
            return _Step(options, False, f"relaunch without exact concurrency (auto): {failure.detail}",
                         drops_exact=True)
        if exact and plan.exact_mode == "on":
            return (f"exact_concurrency is on, and the engine refused it: {failure.detail}. "
                    "Meet that requirement, or set exact_concurrency to auto or off")
        return f"the engine refused to start: {failure.detail}"
    if failure.kind == "out_of_memory":
        current = int(options.get("--ctx-size") or 0) or (plan.native_context or 0)
        smaller = (current // 2) // PAGE_SIZE * PAGE_SIZE
        if smaller < PAGE_SIZE:
            return f"out of memory: {failure.detail} (context {current or 'unknown'} cannot shrink further)"
        return _Step({**options, "--ctx-size": str(smaller)}, exact,
                     f"relaunch with --ctx-size {smaller} (was {current}): out of memory: {failure.detail}")
    if failure.kind == "no_cuda":
        if options.get("--device") == "cpu":
            return f"no usable CUDA device, and the CPU backend failed too: {failure.detail}"
        return _Step({**options, "--device": "cpu"}, exact,
                     f"relaunch with --device cpu: no usable CUDA device: {failure.detail}")
    return terminal_message(failure)


def terminal_message(failure: Failure) -> str:
    return {
        "bad_model": f"the engine could not load the model: {failure.detail}",
        "bad_flags": f"the engine refused its command line: {failure.detail}",
        "port_in_use": f"the engine could not bind its port: {failure.detail}",
        "timeout": failure.detail,
    }.get(failure.kind, f"the engine failed: {failure.detail}")


async def wait_healthy(child: EngineChild, deadline: float) -> str:
    """'ready', 'exited' or 'timeout'; polls /health while watching for the child's exit."""
    exited = asyncio.ensure_future(child.process.wait())
    try:
        async with aiohttp.ClientSession(headers=child.auth_headers) as session:
            while True:
                if exited.done():
                    return "exited"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    timeout = aiohttp.ClientTimeout(total=min(2.0, remaining))
                    async with session.get(child.base_url + "/health", timeout=timeout) as resp:
                        if resp.status == 200:
                            return "ready"
                await asyncio.wait({exited}, timeout=min(HEALTH_POLL_S, max(remaining, 0)))
    finally:
        if not exited.done():
            exited.cancel()


async def fetch_json(child: EngineChild, path: str, timeout_s: float = 5.0) -> Any:
    """A GET on the child; None when it does not answer 200 with JSON."""
    try:
        async with aiohttp.ClientSession(headers=child.auth_headers) as session:
            async with session.get(child.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if r.status != 200:
                    return None
                return await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def stop_process(process: asyncio.subprocess.Process, grace_s: float = STOP_GRACE_S) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def granted_from_props(props: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    """(granted, reason) from /props; granted is None when the engine does not report it."""
    section = props.get("exact_concurrency")
    if not isinstance(section, Mapping) or "granted" not in section:
        return None, None
    value = section["granted"]
    granted = value is True or (isinstance(value, str) and value.lower() in ("on", "true"))
    reason = section.get("reason")
    return granted, reason if isinstance(reason, str) and reason else None


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def _prune_logs(log_dir: Path) -> None:
    logs = sorted(log_dir.glob("engine-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[:-KEEP_LOGS]:
        with contextlib.suppress(OSError):
            old.unlink()


# Loaded once in the parent: the child must not dlopen between fork and exec.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # An engine orphaned by a killed studio would keep its GPU memory with nobody to stop it.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

