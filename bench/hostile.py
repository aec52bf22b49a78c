"""Hostile clients for bench/soak.py --hostile: what issue 25 found, sent while the ordinary soak runs.

Each case expects one status (a 4xx, or 200 for the honest heavy ones); anything else is recorded, a 5xx
or no answer within its deadline ("hang") above all. A probe polls /health throughout, and settings
writers hammer the studio's REST API, whose file must come out whole.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from subprocess import PIPE

import aiohttp

LONE = "abc\ud800def"
HANG_S = 30.0  # no answer within this (beyond the server's own --timeout) is a hang


def cases(body_limit_mib: int) -> list[tuple[str, str, bytes, dict, int]]:
    """(name, path, body, headers, expected status)."""
    over = b'{"content": "' + b"a" * ((body_limit_mib << 20) + 1024) + b'"}'

    def js(obj) -> bytes:
        return json.dumps(obj).encode()  # ensure_ascii: lone surrogates travel as \\ud800 escapes

    user = [{"role": "user", "content": "hi"}]
    return [
        ("oversized body", "/tokenize", over, {}, 413),
        ("gzip bomb", "/tokenize", gzip.compress(over), {"Content-Encoding": "gzip"}, 413),
        ("plain body said gzip", "/completion", js({"prompt": "hi", "n_predict": 1}), {"Content-Encoding": "gzip"},
         400),
        ("surrogate prompt", "/completion", js({"prompt": LONE, "n_predict": 2}), {}, 400),
        ("surrogate chat", "/v1/chat/completions", js({"messages": [{"role": "user", "content": LONE}]}), {}, 400),
        ("surrogate tokenize", "/tokenize", js({"content": LONE}), {}, 400),
        ("surrogate stop", "/completion", js({"prompt": "hi", "stop": [LONE], "stream": True}), {}, 400),
        ("surrogate model", "/v1/chat/completions", js({"model": LONE, "messages": user, "stream": True}), {}, 400),
        ("deep nesting", "/completion", b"[" * 100_000 + b"]" * 100_000, {}, 400),
        ("foreign origin", "/completion", js({"prompt": "hi", "n_predict": 1}), {"Origin": "http://evil.example"},
         403),
        ("rebound host", "/completion", js({"prompt": "hi", "n_predict": 1}), {"Host": "rebind.evil.example"}, 403),
        ("huge tokenize", "/tokenize", js({"content": "def f(x): return x + 1  # café\n" * 30_000}), {}, 200),
        ("prompt beyond the context", "/completion", js({"prompt": "hello world " * 800_000}), {}, 400),
    ]


class Tally:
    def __init__(self):
        self.by_case: dict[str, Counter] = {}
        self.unexpected: list[str] = []

    def add(self, name: str, got: str, expected: str) -> None:
        self.by_case.setdefault(name, Counter())[got] += 1
        if got != expected:
            self.unexpected.append(f"{name}: got {got}, expected {expected}")

    def count(self, pred) -> int:
        return sum(n for c in self.by_case.values() for got, n in c.items() if pred(got))


async def _request(session, base, name, path, body, headers, expected, tally: Tally) -> None:
    try:
        async with asyncio.timeout(HANG_S):
            async with session.post(base + path, data=body, headers=headers) as r:
                await r.read()
                tally.add(name, str(r.status), str(expected))
    except TimeoutError:
        tally.add(name, "hang", str(expected))
    except aiohttp.ClientError as e:
        # the server may answer an oversized body before reading it, and the client sees its write cut
        tally.add(name, "413" if expected == 413 and "write" in str(e).lower() else f"error {type(e).__name__}",
                  str(expected))


async def _raw(port: int, data: bytes, dribble: bytes, every_s: float) -> bytes:
    """Sends `data`, then `dribble` one byte per `every_s` until the server answers or closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(HANG_S):
            read = asyncio.ensure_future(reader.read(65536))
            for b in dribble:
                done, _ = await asyncio.wait([read], timeout=every_s)
                if done:
                    break
                writer.write(bytes([b]))
                await writer.drain()
            return await read
    finally:
        writer.close()


async def _slow_body(port: int, tally: Tally) -> None:
    head = b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{"
    try:
        reply = await _raw(port, head, b" " * 999, 0.5)
        tally.add("slow body", reply[9:12].decode() or "closed", "408")
    except TimeoutError:
        tally.add("slow body", "hang", "408")
    except ConnectionError:
        tally.add("slow body", "closed", "408")


async def _half_sent_headers(port: int, tally: Tally) -> None:
    try:
        reply = await _raw(port, b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le", b"", 0)
        tally.add("half-sent headers", "closed" if reply == b"" else reply[9:12].decode(), "closed")
    except TimeoutError:
        tally.add("half-sent headers", "hang", "closed")
    except ConnectionError:
        tally.add("half-sent headers", "closed", "closed")


async def hostile(base: str, port: int, table: list, rounds: int, seed: int) -> Tally:
    tally = Tally()
    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        for _ in range(rounds):
            batch = [_request(session, base, *c, tally) for c in rng.sample(table, len(table))]
            batch += [_slow_body(port, tally) for _ in range(5)] + [_half_sent_headers(port, tally) for _ in range(30)]
            await asyncio.gather(*batch)
    return tally


def probe_main(base: str, every_s: float = 0.05) -> None:
    """`python bench/hostile.py probe BASE`: polls /health until stdin closes, then prints the latencies.

    A process of its own, so that what it measures is the engine, not the soak's own busy event loop."""
    import http.client
    import sys
    import threading
    from urllib.parse import urlsplit

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    u = urlsplit(base)
    latencies, failures = [], Counter()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            conn.request("GET", "/health")
            r = conn.getresponse()
            r.read()
            conn.close()
            if r.status != 200:
                failures[str(r.status)] += 1
            latencies.append((time.perf_counter() - t0) * 1000)
        except OSError as e:
            failures[type(e).__name__] += 1
        stop.wait(every_s)
    lat = sorted(latencies)

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else None

    print(json.dumps({"polls": len(lat), "failed": dict(failures), "every_ms": every_s * 1000,
                      "ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": q(1.0)}}))


async def health_probe(base: str, stop: asyncio.Event) -> dict:
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "probe", base, stdin=PIPE, stdout=PIPE)
    await stop.wait()
    out, _ = await proc.communicate(b"")
    return json.loads(out)


async def settings_writers(studio_base: str, writers: int, writes: int) -> dict:
    """Writers each own one field and PUT it repeatedly, all at once; the last value of each must survive."""
    fields = [("model_folders", lambda i, k: [f"/soak/writer{i}/{k}"]), ("load", lambda i, k: {"ctx_size": 256 + k}),
              ("health_timeout_s", lambda i, k: 100.0 + k), ("load", lambda i, k: {"parallel": 1 + k % 8})]
    last: dict[int, object] = {}
    statuses: Counter = Counter()
    async with aiohttp.ClientSession() as session:

        async def writer(i: int) -> None:
            name, value = fields[i % len(fields)]
            for k in range(writes):
                body = {name: value(i, k)}
                async with session.put(studio_base + "/api/settings", json=body) as r:
                    statuses[str(r.status)] += 1
                    await r.read()
                    if r.status == 200:
                        last[i] = body

        await asyncio.gather(*(writer(i) for i in range(min(writers, len(fields)))))
        async with session.get(studio_base + "/api/settings") as r:
            final = await r.json()
    return {"statuses": dict(statuses), "last_written": {str(i): v for i, v in last.items()}, "final": final}


def settings_intact(result: dict, settings_file: Path) -> list[str]:
    problems = []
    try:
        on_disk = json.loads(settings_file.read_text())
    except (OSError, ValueError) as e:
        return [f"settings file unreadable after the writers: {e}"]
    for i, body in result["last_written"].items():
        for name, value in body.items():
            have = on_disk.get(name)
            if isinstance(value, dict):
                lost = {k: v for k, v in value.items() if (have or {}).get(k) != v}
                # two writers share "load": each owns one of its keys
                if lost:
                    problems.append(f"writer {i}: {name} {lost} not on disk ({have})")
            elif have != value:
                problems.append(f"writer {i}: {name} = {have!r} on disk, {value!r} last written")
    return problems


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        probe_main(sys.argv[2])
