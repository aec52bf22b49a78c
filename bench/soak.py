"""Soak test: many clients, random requests and disconnects against a real engine; nothing may be lost.

    python bench/soak.py                       # builds the tiny test model, CPU backend
    python bench/soak.py --model DIR --device cuda --out bench/evidence/soak-cuda.json
    python bench/soak.py --hostile --out bench/evidence/soak-hostile-cpu.json   # with issue 25's hostile cases

With --hostile, bench/hostile.py's clients (oversized and compressed bodies, lone surrogates, slow and
half-sent bodies, foreign Host/Origin) run beside the ordinary ones, /health is polled throughout, and
concurrent writers PUT the settings of an in-process studio; none may get a 5xx or hang, /health's p99
must stay under 100 ms and the settings file must hold each writer's last value.

Every request must end in one of two ways: completed (each choice finished, token counts as asked)
or dropped on purpose by its client. Afterwards no page may be held by a sequence, and once the
idle slots' prompt caches are drained the pool's free count must equal the count at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.engine_helpers import (  # noqa: E402
    engine_env,
    free_port,
    parse_metrics,
    sse_events,
    stop_process,
    wait_serving,
)

HEALTH_P99_MS = 100.0
WORDS = ("the quick brown fox jumps over lazy dog hello world exact concurrency page park restore token "
         "def return print import numpy café größe 東京").split()


@dataclass
class Outcome:
    index: int
    endpoint: str
    stream: bool
    n: int
    max_tokens: int
    planned_drop: bool
    status: str = "pending"  # completed | dropped | failed
    detail: str = ""
    finish_reasons: list[str] = field(default_factory=list)
    tokens: int = 0
    ttft_ms: float | None = None
    wall_ms: float = 0.0
    parks: int = 0


# ------------------------------------------------------------------------------------------ engine
def build_tiny_model(where: Path) -> Path:
    from tests.tiny_models import make_hf_model

    out = make_hf_model(where, "llama")
    # no end-of-generation token: random weights would end completions at random and blur the checks
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["eos_token"] = None
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    (out / "generation_config.json").unlink(missing_ok=True)
    return out


class EngineChild:
    def __init__(self, argv: list[str], log_path: Path):
        self.argv = argv
        self.port = int(argv[argv.index("--port") + 1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=engine_env(), stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, deadline_s: float = 120) -> None:
        def health() -> bool:
            with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                return r.status == 200

        wait_serving(self.proc, "engine", health, self.log_path.read_text, deadline_s)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())

    def slots(self) -> list[dict]:
        with urllib.request.urlopen(self.base + "/slots", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> int:
        code = stop_process(self.proc, grace_s=20)
        self.log.close()
        return code


# ------------------------------------------------------------------------------------------ clients
def plan_request(rng: random.Random, index: int, vocab: int, max_len: int, drop_rate: float):
    endpoint = rng.choice(["/completion", "/v1/completions", "/v1/chat/completions"])
    stream = rng.random() < 0.6
    n = rng.choice([1, 1, 1, 2]) if endpoint != "/completion" else 1
    max_tokens = rng.randint(1, 160)
    n_prompt = rng.randint(4, max_len)
    temperature = rng.choice([0.0, 0.7, 1.0])
    body: dict = {"max_tokens" if endpoint != "/completion" else "n_predict": max_tokens, "stream": stream,
                  "temperature": temperature, "seed": rng.randint(0, 2**31), "cache_prompt": rng.random() < 0.5}
    if endpoint == "/v1/chat/completions":
        text = " ".join(rng.choice(WORDS) for _ in range(max(1, n_prompt // 3)))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = [rng.randint(4, vocab - 1) for _ in range(n_prompt)]
    if endpoint != "/completion":
        body["n"] = n
    out = Outcome(index, endpoint, stream, n, max_tokens, rng.random() < drop_rate)
    drop_after = rng.randint(1, 8) if stream else rng.uniform(0.02, 0.6)  # chunks, or seconds
    return body, out, drop_after


def check_final(out: Outcome, body: dict, n_tokens: int) -> None:
    """A completed request: every choice finished; 'length' means exactly the tokens asked for."""
    if len(out.finish_reasons) != out.n:
        raise AssertionError(f"{len(out.finish_reasons)} of {out.n} choices finished")
    for reason in out.finish_reasons:
        if reason not in ("length", "stop"):
            raise AssertionError(f"finish_reason {reason!r}")
    if all(r == "length" for r in out.finish_reasons) and n_tokens != out.max_tokens * out.n:
        raise AssertionError(f"{n_tokens} tokens for {out.n} x {out.max_tokens}")


async def run_one(session: aiohttp.ClientSession, base: str, body: dict, out: Outcome, drop_after) -> None:
    t0 = time.perf_counter()
    try:
        if out.stream:
            await _streamed(session, base, body, out, drop_after, t0)
        elif out.planned_drop:
            try:
                await asyncio.wait_for(_plain(session, base, body, out), timeout=drop_after)
            except TimeoutError:
                out.status = "dropped"
        else:
            await _plain(session, base, body, out)
        if out.status == "pending":
            out.status = "completed"
    except Exception as e:  # every unexpected outcome is recorded, never swallowed
        out.status, out.detail = "failed", f"{type(e).__name__}: {e}"
    out.wall_ms = (time.perf_counter() - t0) * 1000


async def _plain(session, base, body, out: Outcome) -> None:
    async with session.post(base + out.endpoint, json=body) as r:
        data = await r.json(content_type=None)
        if r.status != 200:
            raise AssertionError(f"HTTP {r.status}: {data}")
    if out.endpoint == "/completion":
        out.finish_reasons = [{"limit": "length", "eos": "stop", "word": "stop"}.get(data["stop_type"], "?")]
        out.tokens = data["tokens_predicted"]
        out.parks = data["preempt"]["parks"]
    else:
        out.finish_reasons = [c["finish_reason"] for c in data["choices"]]
        out.tokens = data["usage"]["completion_tokens"]
        out.parks = data["preempt"]["parks"]
    check_final(out, body, out.tokens)


async def _streamed(session, base, body, out: Outcome, drop_after: int, t0: float) -> None:
    chunks, done_seen = 0, False
    tokens = 0
    async with session.post(base + out.endpoint, json=body) as r:
        if r.status != 200:
            raise AssertionError(f"HTTP {r.status}: {await r.text()}")
        async for msg in sse_events(r):
            if msg == "[DONE]":
                done_seen = True
                break
            if "error" in msg:
                raise AssertionError(f"stream error: {msg['error']}")
            chunks += 1
            if out.ttft_ms is None:
                out.ttft_ms = (time.perf_counter() - t0) * 1000
            if out.endpoint == "/completion":
                tokens += len(msg.get("tokens", []))
                if msg["stop"]:
                    out.finish_reasons = [{"limit": "length", "eos": "stop", "word": "stop"}.get(msg["stop_type"])]
                    out.parks = msg["preempt"]["parks"]
                    done_seen = True
            else:
                for c in msg["choices"]:
                    if c.get("finish_reason"):
                        out.finish_reasons.append(c["finish_reason"])
                        out.parks += c.get("preempt", {}).get("parks", 0)
                if msg.get("usage"):
                    tokens = msg["usage"]["completion_tokens"]
            if out.planned_drop and chunks >= drop_after:
                r.close()  # the client goes away mid-stream
                out.status = "dropped"
                return
    if not done_seen:
        raise AssertionError("stream ended without its final event")
    out.tokens = tokens  # OpenAI streams count them in their usage chunk (include_usage is always asked)
    check_final(out, body, tokens)


async def soak(base: str, args, vocab: int) -> list[Outcome]:
    rng = random.Random(args.seed)
    plans = [plan_request(rng, i, vocab, args.max_prompt, args.drop_rate) for i in range(args.requests)]
    for body, out, _ in plans:
        if out.stream and out.endpoint != "/completion":
            body["stream_options"] = {"include_usage": True}
    queue: asyncio.Queue = asyncio.Queue()
    for p in plans:
        queue.put_nowait(p)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            while not queue.empty():
                body, out, drop_after = queue.get_nowait()
                await run_one(session, base, body, out, drop_after)

        await asyncio.gather(*(client() for _ in range(args.clients)))
    return [out for _, out, _ in plans]


async def drain_prompt_caches(base: str, n_slots: int) -> None:
    """A request without prompt cache pinned to each slot releases that slot's cached pages."""
    async with aiohttp.ClientSession() as session:
        for slot in range(n_slots):
            body = {"prompt": [5, 6, 7], "n_predict": 1, "cache_prompt": False, "id_slot": slot}
            async with session.post(base + "/completion", json=body) as r:
                assert r.status == 200, await r.text()


def wait_until(predicate, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


async def soak_hostile(engine: EngineChild, args, vocab: int, work: Path) -> tuple[list[Outcome], dict]:
    """The ordinary soak with bench/hostile.py's clients beside it, a /health probe, and settings writers."""
    from aiohttp import web

    from bench import hostile
    from settings import SettingsStore
    from studio.api import build_app
    from studio.catalog import Catalog
    from studio.manager import LoadManager

    store = SettingsStore(work / "config")
    manager = LoadManager(store, catalog=Catalog([], include_bundled=False), env=dict(os.environ),
                          logs=work / "studio-logs")
    runner = web.AppRunner(build_app(manager, api_key=""), handler_cancellation=True)
    await runner.setup()
    studio_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", studio_port).start()
    table = hostile.cases(16)  # built before the clocks start: gzip of 16 MiB takes a while
    stop = asyncio.Event()
    probe = asyncio.create_task(hostile.health_probe(engine.base, stop))
    try:
        outcomes, tally, writes = await asyncio.gather(
            soak(engine.base, args, vocab),
            hostile.hostile(engine.base, engine.port, table, args.hostile_rounds, args.seed),
            hostile.settings_writers(f"http://127.0.0.1:{studio_port}", 4, 50))
    finally:
        stop.set()
        health = await probe
        await runner.cleanup()
    failures = [f"hostile {u}" for u in tally.unexpected]
    if health["ms"]["p99"] is None or health["ms"]["p99"] >= HEALTH_P99_MS or health["failed"]:
        failures.append(f"/health: {health}")
    failures += hostile.settings_intact(writes, store.path)
    five_xx = tally.count(lambda got: got.startswith("5")) + sum(
        n for status, n in writes["statuses"].items() if status.startswith("5"))
    return outcomes, {"cases": {k: dict(v) for k, v in tally.by_case.items()}, "five_xx": five_xx,
                      "hangs": tally.count(lambda got: got == "hang"), "health": health,
                      "settings": {"statuses": writes["statuses"], "intact": not hostile.settings_intact(
                          writes, store.path), "last_written": writes["last_written"]},
                      "failures": failures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="model to serve (default: build the tiny test model)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--ctx-size", type=int, default=2048, help="pool size; small enough that parks happen")
    p.add_argument("--max-prompt", type=int, default=400)
    p.add_argument("--drop-rate", type=float, default=0.15, help="share of clients that disconnect early")
    p.add_argument("--exact", choices=("on", "off"), default="on")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--request-timeout", type=float, default=300)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "evidence" / "soak-cpu.json")
    p.add_argument("--hostile", action="store_true", help="also run bench/hostile.py's clients and probes")
    p.add_argument("--hostile-rounds", type=int, default=3)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="lockstep-soak-"))
    model = args.model or build_tiny_model(work)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"] if model.is_dir() else 32000
    engine_argv = [sys.executable, "-m", "engine", "-m", str(model), "--port", str(free_port()), "--device",
                   args.device, "-np", str(args.parallel), "-c", str(args.ctx_size), "--kv-unified", "--metrics",
                   "--exact-concurrency", args.exact]
    if args.hostile:
        engine_argv += ["--timeout", "10"]  # slow bodies are cut after 10 s (the default 30 s makes a long soak)
    engine = EngineChild(engine_argv, work / "engine.log")
    failures: list[str] = []
    try:
        engine.wait_ready()
        start = engine.metrics()
        t0 = time.perf_counter()
        if args.hostile:
            outcomes, hostile_report = asyncio.run(soak_hostile(engine, args, vocab, work))
        else:
            outcomes, hostile_report = asyncio.run(soak(engine.base, args, vocab)), None
        wall = time.perf_counter() - t0
        settled = wait_until(lambda: engine.metrics()["pages_used"] == 0
                             and not any(s["is_processing"] for s in engine.slots()), 5.0)
        after = engine.metrics()
        asyncio.run(drain_prompt_caches(engine.base, args.parallel))
        wait_until(lambda: engine.metrics()["pages_free"] == start["pages_free"], 5.0)
        drained = engine.metrics()
        health_ok = urllib.request.urlopen(engine.base + "/health", timeout=5).status == 200
    finally:
        exit_code = engine.stop()

    counts = {s: sum(o.status == s for o in outcomes) for s in ("completed", "dropped", "failed", "pending")}
    for o in outcomes:
        if o.status in ("failed", "pending"):
            failures.append(f"request {o.index} {o.endpoint} stream={o.stream} n={o.n}: {o.status} {o.detail}")
        if o.status == "dropped" and not o.planned_drop:
            failures.append(f"request {o.index}: dropped without being asked to")
    if not settled or after["pages_used"] != 0:
        failures.append(f"pages still held by sequences after the soak: {after['pages_used']}")
    if after["pages_free"] + after["pages_cached"] != after["pages_total"]:
        failures.append("free + cached pages do not add up to the pool")
    if drained["pages_free"] != start["pages_free"]:
        failures.append(f"free pages {drained['pages_free']:.0f} != {start['pages_free']:.0f} at start")
    if not health_ok:
        failures.append("engine unhealthy after the soak")
    if exit_code != 0:
        failures.append(f"engine exited with {exit_code} on SIGTERM")

    five_xx = sum(o.status == "failed" and o.detail.startswith("AssertionError: HTTP 5") for o in outcomes)
    if hostile_report:
        failures += hostile_report["failures"]
        five_xx += hostile_report["five_xx"]
    completed = [o for o in outcomes if o.status == "completed"]
    tokens = sum(o.tokens for o in completed)
    report = {
        "what": "soak: random requests and disconnects against one engine; nothing lost, no page leaked",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "engine_argv": [a if a != str(model) else model.name for a in engine_argv[1:]],
        "model": model.name,
        "clients": args.clients, "requests": args.requests, "drop_rate": args.drop_rate, "seed": args.seed,
        "outcomes": counts,
        "planned_drops": sum(o.planned_drop for o in outcomes),
        "by_endpoint": {ep: sum(o.endpoint == ep for o in outcomes)
                        for ep in ("/completion", "/v1/completions", "/v1/chat/completions")},
        "streamed": sum(o.stream for o in outcomes),
        "n2_requests": sum(o.n == 2 for o in outcomes),
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "completed_tokens_per_s": round(tokens / wall, 1) if wall else None,
        "ttft_ms": {"p50": percentile([o.ttft_ms for o in completed if o.ttft_ms], 0.5),
                    "p90": percentile([o.ttft_ms for o in completed if o.ttft_ms], 0.9),
                    "max": percentile([o.ttft_ms for o in completed if o.ttft_ms], 1.0)},
        "request_ms": {"p50": percentile([o.wall_ms for o in completed], 0.5),
                       "p90": percentile([o.wall_ms for o in completed], 0.9)},
        "pages": {"total": start["pages_total"], "free_at_start": start["pages_free"],
                  "after": {k: after[k] for k in ("pages_free", "pages_cached", "pages_used")},
                  "free_after_cache_drain": drained["pages_free"]},
        "preemption": {"parks": after["parks_total"], "restores": after["restores_total"],
                       "recomputes": after["recomputes_total"],
                       "parks_reported_by_completed": sum(o.parks for o in completed)},
        "engine_exit_code": exit_code,
        "five_xx": five_xx,
        "hostile": hostile_report,
        "passed": not failures,
        "failures": failures,
        "requests_detail": [asdict(o) for o in outcomes],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    summary = {k: report[k] for k in ("outcomes", "completion_tokens", "wall_s", "completed_tokens_per_s",
                                      "pages", "preemption", "five_xx", "passed")}
    if hostile_report:
        summary["health"] = hostile_report["health"]
    print(json.dumps(summary, indent=1))
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
