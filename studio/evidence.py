"""The exactness evidence matrix: P0's tokens and logprobs under every condition the contract names.

Each cell runs P0 on a real engine (started here, or the loaded one for cells that need no special
server) and compares its token ids and logprobs bit for bit with P0 run solo on the base server. A
worker that fails fails the whole run; every server started here is stopped, on errors too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

ENGINE_CMD: tuple[str, ...] = (sys.executable, "-m", "engine")
BASE_FLAGS = ("--parallel", "8", "--ctx-size", "4096", "--kv-unified", "--exact-concurrency", "on")


CELLS: tuple[str, ...] = (
    "solo_twice", "beside_3", "beside_7", "prompt_cache_hit", "n2_first", "n2_second", "seeded_beside_7",
    "ids_only_beside_7",
    "forced_parks_7", "parallel_2", "ctx_1024", "ubatch_16", "speculation_4", "speculation_2_parks",
)


class EvidenceError(Exception):
    """The run could not produce a complete report."""


@dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]

    def first_token_difference(self, other: Sample) -> int | None:
        """Index of the first differing token id (logprobs ignored); None when the ids agree."""
        for i, (a, b) in enumerate(zip(self.tokens, other.tokens, strict=False)):
            if a != b:
                return i
        return None if len(self.tokens) == len(other.tokens) else min(len(self.tokens), len(other.tokens))

    def first_difference(self, other: Sample) -> int | None:
        """Index of the first token whose id or logprob bits differ; None when identical. Ids only
        where a sample was taken without logprobs."""
        if not self.logprobs or not other.logprobs:
            return self.first_token_difference(other)
        for i, (a, b) in enumerate(zip(self.tokens, other.tokens, strict=False)):
            if a != b or struct.pack("<d", self.logprobs[i]) != struct.pack("<d", other.logprobs[i]):
                return i
        if len(self.tokens) != len(other.tokens):
            return min(len(self.tokens), len(other.tokens))
        return None


@dataclass
class Cell:
    name: str
    description: str
    identical: bool
    first_diff: int | None  # first token whose id or logprob bits differ
    first_token_diff: int | None  # first token whose id differs
    n_tokens: int


@dataclass
class Report:
    model: str
    exact: str
    n_predict: int
    prompts: int
    cells: list[Cell] = field(default_factory=list)
    servers: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def all_identical(self) -> bool:
        return all(c.identical for c in self.cells)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "all_identical": self.all_identical}, indent=2)

    def table(self) -> str:
        rows = [f"{'cell':<20} {'result':<34} description", "-" * 100]
        for c in self.cells:
            res = "identical" if c.identical else f"differs at token {c.first_diff}"
            if not c.identical:
                res += " (logprob only)" if c.first_token_diff is None else f" (ids from {c.first_token_diff})"
            rows.append(f"{c.name:<20} {res:<34} {c.description}")
        return "\n".join(rows)


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    low = min(10, vocab // 4)  # leave the lowest ids alone: small vocabularies keep their specials there
    return [[rng.randrange(low, vocab) for _ in range(length + 7 * i)] for i in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineServer:
    """A real engine child for one group of cells."""

    def __init__(self, model: str, flags: Sequence[str], env: dict[str, str] | None = None,
                 engine_cmd: Sequence[str] = ENGINE_CMD, log_dir: Path | None = None):
        self.port = _free_port()
        self.argv = [*engine_cmd, "-m", model, "--port", str(self.port), *flags]
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.inherited: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, session: aiohttp.ClientSession, timeout: float = 300.0) -> None:
        log = open(self.log_dir / f"engine-{self.port}.log", "wb") if self.log_dir else asyncio.subprocess.DEVNULL
        self.proc = await asyncio.create_subprocess_exec(*self.argv, env=self.env, stdout=log, stderr=log,
                                                         stdin=asyncio.subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise EvidenceError(f"engine exited with {self.proc.returncode}: {' '.join(self.argv)}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        # read once it serves: just after the fork /proc still shows the parent's environment
                        self.inherited = _lockstep_environ(self.proc.pid)
                        return
            await asyncio.sleep(0.1)
        raise EvidenceError(f"engine did not become healthy in {timeout:.0f} s: {' '.join(self.argv)}")

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def describe(self) -> dict:
        return {"argv": self.argv, "inherited_env": self.inherited}


def _lockstep_environ(pid: int) -> dict[str, str]:
    """The LOCKSTEP_* variables the child really has (read back from the kernel, not from our dict)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs if k.startswith(b"LOCKSTEP_")}


async def complete(session: aiohttp.ClientSession, url: str, prompt: list[int], n_predict: int, *,
                   temperature: float = 0.0, seed: int = 0, cache_prompt: bool = False, n: int = 1,
                   logprobs: bool = True) -> list[Sample]:
    """`logprobs=False` takes the token ids alone: greedy steps then need no logits rows on the host,
    and the engine launches decode steps ahead (fed from the previous step's argmax on the device)."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, "seed": seed,
            "cache_prompt": cache_prompt, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "return_tokens": True}
    if logprobs:
        body["n_probs"] = 1
    if n > 1:
        body["n"] = n
    async with session.post(url + "/completion", json=body) as r:
        data = await r.json()
        if r.status != 200:
            raise EvidenceError(f"completion failed with HTTP {r.status}: {data}")
    results = data if isinstance(data, list) else [data]
    if not logprobs:
        return [Sample(list(d["tokens"]), []) for d in results]
    return [Sample([p["id"] for p in d["completion_probabilities"]],
                   [p["logprob"] for p in d["completion_probabilities"]]) for d in results]


Completer = Callable[..., Awaitable[list[Sample]]]


async def run_matrix(model: str, *, vocab: int, n_prompts: int = 8, prompt_len: int = 48, n_predict: int = 24,
                     device: str = "cpu", exact: bool = True, engine_cmd: Sequence[str] = ENGINE_CMD,
                     log_dir: Path | None = None, progress: Callable[[str], None] | None = None,
                     complete_fn: Completer = complete, extra_variants: Sequence[tuple] = (),
                     long_prompt: int = 0, long_parks: int = 7, only: Sequence[str] | None = None) -> Report:
    """Runs every cell; raises EvidenceError when any worker fails (no partial report). `only`: of
    the cells on servers of their own, just these (the base server's cells always run).
    `extra_variants`: more server cells after the standard ones, each (name, description, flags,
    env, neighbours) like theirs. `long_prompt`: a last cell, a prompt of that many tokens beside 7
    others and parked every `long_parks` tokens, against the same prompt alone (both servers with the
    context it needs)."""
    t0 = time.monotonic()
    say = progress or (lambda _msg: None)
    mode = "on" if exact else "off"
    base = [*BASE_FLAGS[:-1], mode, "--device", device]
    prompts = make_prompts(n_prompts, prompt_len, vocab)
    p0 = prompts[0]
    report = Report(model, mode, n_predict, n_prompts)
    servers: list[EngineServer] = []
    timeout = aiohttp.ClientTimeout(total=600)

    def cell(name: str, description: str, ref: Sample, got: Sample) -> None:
        diff = ref.first_difference(got)
        report.cells.append(Cell(name, description, diff is None, diff, ref.first_token_difference(got),
                                 len(got.tokens)))
        say(f"{name}: {'identical' if diff is None else f'differs at token {diff}'}")

    async def server(session, flags=(), env=None) -> EngineServer:
        flags = list(flags)
        merged = list(base)
        for i in range(0, len(flags), 2):  # a variant flag replaces the base's value
            if flags[i] in merged:
                merged[merged.index(flags[i]) + 1] = flags[i + 1]
            else:
                merged += flags[i : i + 2]
        s = EngineServer(model, merged, env, engine_cmd, log_dir)
        servers.append(s)
        await s.start(session)
        return s

    async def solo(s: EngineServer, **kw) -> Sample:
        return (await complete_fn(session, s.url, p0, n_predict, **kw))[0]

    async def beside(s: EngineServer, k: int, **kw) -> Sample:
        jobs = [complete_fn(session, s.url, p, n_predict, **kw) for p in [p0, *prompts[1 : k + 1]]]
        return (await asyncio.gather(*jobs))[0][0]

    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            say("starting the base server")
            b = await server(session)
            ref = await solo(b)
            cell("solo_twice", "P0 alone, run again", ref, await solo(b))
            cell("beside_3", "P0 beside 3 neighbours", ref, await beside(b, 3))
            cell("beside_7", "P0 beside 7 neighbours", ref, await beside(b, 7))
            await solo(b, cache_prompt=True)
            cell("prompt_cache_hit", "P0 after its prefix was cached", ref, await solo(b, cache_prompt=True))
            pair = await complete_fn(session, b.url, p0, n_predict, n=2)
            cell("n2_first", "n=2 at temperature 0, completion 0", ref, pair[0])
            cell("n2_second", "n=2 at temperature 0, completion 1", ref, pair[1])
            seeded = await solo(b, temperature=0.9, seed=1234)
            cell("seeded_beside_7", "temperature 0.9 seed 1234, beside 7", seeded,
                 await beside(b, 7, temperature=0.9, seed=1234))
            cell("ids_only_beside_7", "no logprobs asked (decode steps launched ahead), beside 7; ids", ref,
                 await beside(b, 7, logprobs=False))
            await b.stop()
            variants = [
                ("forced_parks_7", "parked and restored every 7 tokens, beside 3", (),
                 {"LOCKSTEP_PREEMPT_EVERY": "7"}, 3),
                ("parallel_2", "--parallel 2", ("--parallel", "2"), None, 0),
                ("ctx_1024", "--ctx-size 1024", ("--ctx-size", "1024"), None, 0),
                ("ubatch_16", "-ub 16: other prompt chunking, beside 3", ("--ubatch-size", "16"), None, 3),
                ("speculation_4", "n-gram drafts up to 4 tokens, beside 3",
                 ("--spec-type", "ngram", "--spec-draft-n-max", "4"), None, 3),
                ("speculation_2_parks", "drafts up to 2 tokens, parked every 7 tokens, beside 3",
                 ("--spec-type", "ngram", "--spec-draft-n-max", "2"), {"LOCKSTEP_PREEMPT_EVERY": "7"}, 3),
            ]
            for name, desc, flags, env, k in [*variants, *extra_variants]:
                if only is not None and name not in only:
                    continue
                say(f"starting a server for {name}")
                s = await server(session, flags, env)
                cell(name, desc, ref, await (beside(s, k) if k else solo(s)))
                await s.stop()
            if long_prompt:
                p_long = make_prompts(1, long_prompt, vocab, seed=1)[0]
                flags = ("--ctx-size", str(long_prompt + 4096))
                say(f"starting the servers for a {long_prompt}-token prompt")
                s = await server(session, flags)
                alone = (await complete_fn(session, s.url, p_long, n_predict))[0]
                await s.stop()
                s = await server(session, flags, {"LOCKSTEP_PREEMPT_EVERY": str(long_parks)})
                jobs = [complete_fn(session, s.url, p, n_predict) for p in [p_long, *prompts[1:8]]]
                cell(f"long_{long_prompt}_beside_7_parks_{long_parks}",
                     f"a {long_prompt}-token prompt beside 7, parked every {long_parks} tokens", alone,
                     (await asyncio.gather(*jobs))[0][0])
                await s.stop()
    except EvidenceError:
        raise
    except Exception as e:  # any worker failure fails the run
        raise EvidenceError(f"{type(e).__name__}: {e}") from e
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
        report.servers = [s.describe() for s in servers]
    report.seconds = round(time.monotonic() - t0, 2)
    return report
