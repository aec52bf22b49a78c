"""Spawning the engine child and walking the relaunch ladder.

One attempt = one child, one port, one log file. An attempt ends ready (GET /health answered 200),
or failed: it exited first, or the deadline passed. A failure is classified and the ladder
(studio/ladder.py) decides whether a changed command line is worth another attempt (at most
MAX_ATTEMPTS in all).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from settings import ENV_EXACT_INHERITED, ENV_PREEMPT
from studio.engine_child import (
    EngineChild,
    child_env,
    die_with_parent,
    fetch_json,
    free_port,
    stop_process,
    wait_healthy,
)
from studio.failures import Failure, classify
from studio.flags import Options, Owned, compose_argv, redact_argv
from studio.ladder import next_step
from studio.load_plan import LaunchPlan

MAX_ATTEMPTS = 4
KEEP_LOGS = 200
ENGINE_CMD: tuple[str, ...] = (sys.executable, "-m", "engine")
# Process-wide, so two loads within one second never share a log file whichever Launcher runs them.
_LOAD_SERIAL = itertools.count(1)


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
                stderr=asyncio.subprocess.STDOUT, env=env, preexec_fn=die_with_parent,
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


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def _prune_logs(log_dir: Path) -> None:
    logs = sorted(log_dir.glob("engine-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[:-KEEP_LOGS]:
        with contextlib.suppress(OSError):
            old.unlink()
