"""A real engine child process for integration tests: started on a free port, ready when /health says so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCKSTEP_EXACT", "LOCKSTEP_PREEMPT_EVERY")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def run_engine(args: list[str], env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs the engine to its exit (for flag and precondition failures)."""
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=engine_env(env),
                          capture_output=True, text=True, timeout=timeout)


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


async def sse_events(response):
    """The `data:` payloads of an aiohttp response's event stream as they arrive: parsed JSON, and
    "[DONE]" as the string."""
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data:"):
            data = line[5:].strip()
            yield data if data == "[DONE]" else json.loads(data)


def parse_metrics(text: str) -> dict[str, float]:
    """/metrics as {name without its prefix: value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split(":", 1)[1]] = float(value)
    return out


def stop_process(proc: subprocess.Popen, grace_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def wait_serving(proc: subprocess.Popen, what: str, probe, output, deadline_s: float) -> None:
    """Polls `probe()` (True once the server answers; OSError while it is not listening) until it
    holds; a RuntimeError with the log if the process exits, a TimeoutError past the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{output()}")
        try:
            if probe():
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.05)  # a poll interval, bounded by the deadline
    raise TimeoutError(f"{what} not ready within {deadline_s} s:\n{output()}")


class Engine:
    def __init__(self, model: Path, *args: str, env: dict | None = None, api_key: str | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        argv = [sys.executable, "-m", "engine", "-m", str(model), "--port", str(self.port), "--device", "cpu",
                *args]
        if api_key:
            argv += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="engine-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=engine_env(env), stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def wait_ready(self, deadline_s: float = 90.0) -> Engine:
        def health() -> bool:
            with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                return r.status == 200

        wait_serving(self.proc, "engine", health, self.output, deadline_s)
        return self

    def get_json(self, path: str):
        req = urllib.request.Request(self.base + path, headers=self.headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def metrics(self) -> dict[str, float]:
        req = urllib.request.Request(self.base + "/metrics", headers=self.headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            return parse_metrics(r.read().decode())

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        os.unlink(self.log.name)
