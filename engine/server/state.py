"""What the HTTP handlers share: the launch options, the model once loaded, the scheduler, counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from engine.args import EngineArgs
from engine.exact import ExactStatus
from engine.loader import LoadedModel
from engine.sampler import SamplingParams
from engine.scheduler import Scheduler
from engine.server.errors import ApiError
from engine.server.offload import Workers

try:
    from importlib.metadata import version as _version

    VERSION = _version("lockstep")
except Exception:  # not installed (a source checkout run with PYTHONPATH)
    VERSION = "0.1.0"
LLAMA_BUILD_INFO = f"b0-lockstep-{VERSION}"  # llama-server's `b<build>-<commit>` for /props: build 0, our version


@dataclass
class Tally:
    """Tokens and the milliseconds they took."""

    tokens: int = 0
    ms: float = 0.0


@dataclass
class Served:
    """Counters the scheduler does not keep: finished completions and their decode time."""

    completions: int = 0
    cached_tokens: int = 0
    max_tokens: int = 0  # the longest sequence (prompt and generated) finished so far
    predicted: Tally = field(default_factory=Tally)  # generated tokens, decode time
    prompt: Tally = field(default_factory=Tally)  # prompt tokens processed (cached ones apart), their time
    _mark: tuple = (0, 0.0, 0, 0.0)  # the four figures `window` read last

    def totals(self) -> tuple[int, float, int, float]:
        """(predicted tokens, their ms, prompt tokens, their ms) since the start."""
        return self.predicted.tokens, self.predicted.ms, self.prompt.tokens, self.prompt.ms

    def window(self) -> tuple[int, float, int, float]:
        """The `totals` since the previous call."""
        now = self.totals()
        out = tuple(a - b for a, b in zip(now, self._mark, strict=True))
        self._mark = now
        return out

    def add(self, done) -> None:
        t = done.timings or {}
        self.completions += 1
        self.cached_tokens += done.cached_tokens
        self.max_tokens = max(self.max_tokens, done.prompt_tokens + done.completion_tokens)
        self.predicted.tokens += int(t.get("predicted_n", 0))
        self.predicted.ms += float(t.get("predicted_ms", 0.0))
        self.prompt.tokens += int(t.get("prompt_n", 0))
        self.prompt.ms += float(t.get("prompt_ms", 0.0))


@dataclass
class EngineState:
    opts: EngineArgs
    exact: ExactStatus
    backend: str
    loaded: LoadedModel | None = None
    scheduler: Scheduler | None = None
    n_ctx: int = 0  # the pool's size in tokens
    cpu_threads: dict = field(default_factory=dict)  # engine.threads.threads_report() after the load
    load_seconds: dict = field(default_factory=dict)  # /props: the load's parts (weights, self-check, warm-up)
    parallel: dict = field(default_factory=lambda: {"tp": 1})  # /props tensor_parallel: what the load split
    defaults: SamplingParams = field(default_factory=SamplingParams)
    served: Served = field(default_factory=Served)
    started: float = field(default_factory=time.time)
    workers: Workers = field(default_factory=Workers)
    max_token_bytes: int = 1  # the vocabulary's longest token: text of n bytes is at least n / this tokens
    generations: set = field(default_factory=set)  # running, so that a shutdown can end each
    stopping: bool = False
    sleeper: object | None = None  # engine.server.sleep.Sleeper with --sleep-idle-seconds

    @property
    def sleeping(self) -> bool:
        return self.sleeper is not None and self.sleeper.sleeping

    def stats(self) -> dict:
        """The scheduler's figures for /metrics (across sleeps with --sleep-idle-seconds)."""
        return self.sleeper.stats() if self.sleeper is not None else self.scheduler.stats()

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    def __post_init__(self) -> None:
        temp = getattr(self.opts, "temp", None)
        if temp is not None:
            self.defaults = SamplingParams(temperature=temp)

    @property
    def aliases(self) -> list[str]:
        names = [n.strip() for n in (self.opts.alias or "").split(",") if n.strip()]
        return sorted(set(names)) or [Path(self.opts.model).name]

    @property
    def alias(self) -> str:
        """The model's id: the first alias in sorted order, as llama-server picks it."""
        return self.aliases[0]

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def build_info(self) -> str:
        return f"lockstep {VERSION} ({self.backend})"

    def model_name(self, requested: object) -> str:
        """Like llama-server, the one loaded model answers to any name; responses echo the one asked for."""
        return requested if isinstance(requested, str) and requested else self.alias

    def require_ready(self) -> None:
        if not self.ready:
            raise ApiError(503, "Loading model")


STATE = web.AppKey("state", EngineState)


def state_of(request: web.Request) -> EngineState:
    return request.app[STATE]
