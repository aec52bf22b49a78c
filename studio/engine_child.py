"""The engine child process: its environment and port, waiting for its health, GETs of its JSON,
what its /props says it granted, stopping it, and its death with the studio.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from contract import env as env_names
from settings import ENV_EXACT_INHERITED, ENV_PREEMPT

STOP_GRACE_S = 10.0
HEALTH_POLL_S = 0.1
# The engine reads its key from here, as llama-server does: an environment is private to the user, argv is not.
ENV_ENGINE_KEY = env_names.ENGINE_API_KEY
ENV_STUDIO_KEY = env_names.API_KEY


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


# Loaded once in the parent: the child must not dlopen between fork and exec.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    # An engine orphaned by a killed studio would keep its GPU memory with nobody to stop it.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

