"""A real `lockstep serve` process for tests, and raw HTTP that sends headers and paths exactly as given."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.engine_helpers import ROOT, engine_env, free_port, wait_serving

# The studio's own exact/preempt variables would change what a test's load asks for.
EXACT_VARS = ("LOCKSTEP_EXACT", "LOCKSTEP_EXACT_CONCURRENCY", "LOCKSTEP_PREEMPT_MODE")
STUDIO_VARS = (*EXACT_VARS, "LOCKSTEP_API_KEY", "LOCKSTEP_API_HOST", "LOCKSTEP_API_PORT", "LOCKSTEP_MODEL_DIRS",
               "LLAMA_API_KEY")


async def in_process_studio(tmp_path: Path, model: Path, extra_env: dict | None = None):
    """The studio app in this process (aiohttp TestClient, `client.model` = the model's name) over a
    catalog of `model`'s folder; its loads start real engine children. The caller closes it."""
    from aiohttp.test_utils import TestClient, TestServer

    from settings import SettingsStore
    from studio.api import build_app
    from studio.catalog import Catalog
    from studio.manager import LoadManager

    env = {k: v for k, v in os.environ.items() if k not in EXACT_VARS} | (extra_env or {})
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([model.parent], include_bundled=False),
                          env=env, logs=tmp_path / "logs")
    client = TestClient(TestServer(build_app(manager)))
    await client.start_server()
    client.model = model.name
    return client


def raw(port: int, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None,
        host: str | None = None, timeout: float = 60) -> tuple[int, dict, bytes]:
    """One request with exactly this Host header and path (no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{port}")
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        data = body.encode() if isinstance(body, str) else body
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


class Studio:
    """`python -m studio serve` on a free port with its own config and log folders."""

    def __init__(self, config: Path, logs: Path, *args: str, models: Path | None = None, key: str | None = None,
                 env: dict | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.key = key
        full = {k: v for k, v in engine_env().items() if k not in STUDIO_VARS}
        full.update({"LOCKSTEP_CONFIG_DIR": str(config), "LOCKSTEP_LOG_DIR": str(logs)})
        if models is not None:
            full["LOCKSTEP_MODEL_DIRS"] = str(models)
        full.update(env or {})
        self.err = tempfile.NamedTemporaryFile("w+", prefix="studio-", suffix=".log", delete=False)
        self.argv = [sys.executable, "-m", "studio", "serve", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=full, stdout=self.err, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return Path(self.err.name).read_text()

    def headers(self, extra: dict | None = None) -> dict:
        base = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        return {**base, **(extra or {})}

    def wait_ready(self, deadline_s: float = 60) -> Studio:
        def status() -> bool:
            return raw(self.port, "GET", "/api/status", headers=self.headers(), timeout=5)[0] == 200

        wait_serving(self.proc, "studio", status, self.output, deadline_s)
        return self

    def call(self, method: str, path: str, body=None, headers: dict | None = None, **kw) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body)
        extra = {"Content-Type": "application/json"} if body is not None else {}
        status, _, payload = raw(self.port, method, path, data, self.headers({**extra, **(headers or {})}), **kw)
        return status, json.loads(payload) if payload else {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def engine_child(port: int):
    """The engine child of this process that listens on `port` (psutil.Process), or None."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "engine" in argv and str(port) in argv:
            return child
    return None


async def pause_mid_load(manager, deadline_s: float = 60):
    """SIGSTOPs the loading engine child once its log holds a load-progress line, so that a test sees the
    load in progress however fast the machine is; returns the child (the caller SIGCONTs it)."""
    import asyncio
    import signal
    import time

    from contract.progress import PREFIX

    deadline = time.monotonic() + deadline_s
    while True:
        live = manager.loaded.live if manager.loaded is not None else []
        if live and PREFIX in Path(live[-1].log_path).read_text() and (child := engine_child(live[-1].port)):
            child.send_signal(signal.SIGSTOP)
            return child
        assert time.monotonic() < deadline, "no load-progress line within the deadline"
        await asyncio.sleep(0.02)
