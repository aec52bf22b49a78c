"""Issue 25 items 4 and 6: the event loop never waits. Tokenizing, rendering and detokenizing run on worker
threads, bodies are bounded in size (also after decompression) and in time, and connections in number;
/health answers while any of this goes on. Against a real engine child."""

import asyncio
import gzip
import json
import socket
import time

import aiohttp
import pytest

HEALTH_BOUND_S = 0.100  # issue 25: /health answers within 100 ms while heavy requests run
WORDS = "def fibonacci(n): return n + 1 if n < 2 else fibonacci(n - 1) # café größe\n"


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "-np", "2", "-c", "512", "--timeout", "2")


async def health_latencies_while(s, eng, task: asyncio.Task, at_least: int = 10) -> list[float]:
    """Polls /health until `task` ends; returns each answer's latency (at least `at_least` polls overlap it)."""
    latencies = []
    while not task.done():
        t0 = time.perf_counter()
        async with s.get(eng.base + "/health") as r:
            assert r.status == 200
        latencies.append(time.perf_counter() - t0)
        await asyncio.sleep(0.02)
    assert len(latencies) >= at_least, f"the heavy request ended after {len(latencies)} polls: it was not heavy"
    return latencies


async def test_health_answers_within_100ms_while_a_huge_tokenize_runs(eng):
    body = json.dumps({"content": WORDS * 13_000}).encode()  # 1 MB of text (the most): seconds of tokenizing
    async with aiohttp.ClientSession() as s:
        async with s.get(eng.base + "/health") as r:  # the connection pool's first connection is set up
            assert r.status == 200

        async def tokenize():
            async with s.post(eng.base + "/tokenize", data=body) as r:
                return r.status, await r.read()  # parsed later: parsing here would delay this client's polls

        task = asyncio.create_task(tokenize())
        latencies = await health_latencies_while(s, eng, task)
        status, raw = await task
    assert status == 200 and len(json.loads(raw)["tokens"]) > 500_000
    # the 95th percentile: on a shared 2-core machine the OS alone stalls a process now and then, while an
    # event loop that waits for the tokenizer stalls every poll (before the fix: a few polls, seconds each)
    p95 = sorted(latencies)[int(0.95 * len(latencies))]
    assert p95 < HEALTH_BOUND_S, (f"/health p95 {p95 * 1000:.0f} ms (max {max(latencies) * 1000:.0f} ms) while "
                                  f"/tokenize ran ({len(latencies)} polls)")


async def test_tokenize_is_bounded(eng):
    async with aiohttp.ClientSession() as s:
        async with s.post(eng.base + "/tokenize", json={"content": "x" * ((1 << 20) + 1)}) as r:
            assert r.status == 400 and "at most 1048576" in (await r.json())["error"]["message"]


async def test_a_prompt_far_beyond_the_context_is_refused_before_tokenizing(eng):
    async with aiohttp.ClientSession() as s:
        for path, body in (("/completion", {"prompt": WORDS * 150_000}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": WORDS * 150_000}]})):
            t0 = time.perf_counter()
            async with s.post(eng.base + path, json=body) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert err["type"] == "exceed_context_size_error" and "the context holds" in err["message"], err
            # tokenizing 11 MB takes seconds on this machine; the refusal comes from the text's length
            assert "at least" in err["message"], (err, time.perf_counter() - t0)


async def test_bodies_over_the_limit_are_413_also_after_decompression(eng):
    async with aiohttp.ClientSession() as s:
        big = b'{"content": "' + b"a" * (17 << 20) + b'"}'
        async with s.post(eng.base + "/tokenize", data=big) as r:
            assert r.status == 413 and "--body-limit" in (await r.json())["error"]["message"]
        bomb = gzip.compress(big)  # 17 MiB that travel as about 17 KB
        assert len(bomb) < 100_000
        async with s.post(eng.base + "/tokenize", data=bomb, headers={"Content-Encoding": "gzip"}) as r:
            assert r.status == 413
            assert "after decompression" in (await r.json())["error"]["message"]
        async with s.get(eng.base + "/health") as r:
            assert r.status == 200


def test_the_limit_is_refused_from_the_header_without_reading_the_body(eng):
    with socket.create_connection(("127.0.0.1", eng.port), timeout=30) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000000\r\n\r\n")
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def read_until_closed(sock: socket.socket, deadline_s: float) -> bytes:
    sock.settimeout(deadline_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        raise AssertionError(f"the server held the connection for {deadline_s} s: {out[:200]!r}") from None
    return out


def test_a_slow_body_gets_408_after_the_timeout(eng):
    # --timeout 2: a body dribbling in one byte at a time does not hold the request for good
    with socket.create_connection(("127.0.0.1", eng.port)) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        sock.settimeout(0.3)
        reply = b""
        end = time.monotonic() + 30
        while not reply and time.monotonic() < end:
            try:
                sock.sendall(b" ")
                reply = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert b"--timeout" in reply


def test_half_sent_headers_are_dropped_after_the_timeout(eng):
    socks = [socket.create_connection(("127.0.0.1", eng.port)) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        for s in socks:
            assert read_until_closed(s, 30) == b""  # closed by the server, which answered nothing
    finally:
        for s in socks:
            s.close()


async def test_connections_beyond_the_limit_get_503(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos, "-np", "1", "-c", "256", "--max-connections", "8")
    idle = [socket.create_connection(("127.0.0.1", eng.port)) for _ in range(8)]
    try:
        extra = socket.create_connection(("127.0.0.1", eng.port))
        reply = read_until_closed(extra, 30)
        extra.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        assert "--max-connections" in json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["message"]
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 30  # the idle ones' slots come back as the server sees them closed
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(eng.base + "/health") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
