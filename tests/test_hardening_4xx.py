"""Issue 25 item 7: client input never gets a 5xx. Lone surrogates, deep nesting, a body that is not what its
Content-Encoding says and HTTP parser errors are 4xx in the JSON error shape, logged in one line without a
traceback, against a real engine child."""

import gzip
import json
import socket
import time

import aiohttp
import pytest

USER = [{"role": "user", "content": "hi"}]
LONE = "abc\ud800def"

# (name, endpoint, body): every string field a request can carry, with a lone surrogate
SURROGATES = [
    ("prompt", "/completion", {"prompt": LONE, "n_predict": 2}),
    ("openai prompt", "/v1/completions", {"prompt": LONE, "max_tokens": 2}),
    ("chat content", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]}),
    ("chat content part", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "x\udfff"}]}]}),
    ("tokenize", "/tokenize", {"content": LONE}),
    ("stop, streamed", "/completion", {"prompt": "hi", "n_predict": 4, "stop": ["\ud83d"], "stream": True}),
    ("model, streamed", "/v1/chat/completions", {"model": "m\udc00", "messages": USER, "stream": True}),
    ("a key", "/completion", {"prompt": "hi", "n_predict": 2, "x\ud800": 1}),
]


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "-np", "2", "-c", "512")


async def serves_on(s, eng):
    async with s.post(eng.base + "/completion", json={"prompt": "ok", "n_predict": 2}) as r:
        assert r.status == 200 and (await r.json())["tokens_predicted"] == 2


@pytest.mark.parametrize("name, path, body", SURROGATES, ids=[c[0] for c in SURROGATES])
async def test_a_lone_surrogate_is_a_400_naming_the_field(eng, name, path, body):
    data = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as a \\ud800 escape, as JS sends it
    assert b"\\ud8" in data or b"\\udf" in data or b"\\udc" in data
    async with aiohttp.ClientSession() as s:
        async with s.post(eng.base + path, data=data, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400, await r.text()
            assert r.content_type == "application/json"  # not an event stream that then breaks
            err = (await r.json())["error"]
        assert "lone UTF-16 surrogate" in err["message"] and err["type"] == "invalid_request_error", err
        await serves_on(s, eng)


async def test_surrogate_pairs_are_text_and_pass(eng):
    async with aiohttp.ClientSession() as s:
        data = json.dumps({"content": "snake \U0001f40d"}).encode()  # an escaped pair: one character
        async with s.post(eng.base + "/tokenize", data=data) as r:
            assert r.status == 200 and (await r.json())["tokens"]


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/tokenize"])
async def test_deeply_nested_json_is_a_400(eng, path):
    depth = 200_000
    async with aiohttp.ClientSession() as s:
        for data in (b"[" * depth + b"]" * depth, b'{"prompt": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"):
            async with s.post(eng.base + path, data=data) as r:
                assert r.status == 400, await r.text()
                assert "nested too deeply" in (await r.json())["error"]["message"]
        await serves_on(s, eng)


async def test_content_encoding_that_the_body_is_not_is_a_400(eng):
    async with aiohttp.ClientSession() as s:
        for coding in ("gzip", "deflate"):
            async with s.post(eng.base + "/completion", data=b'{"prompt": "hi", "n_predict": 2}',
                              headers={"Content-Encoding": coding, "Content-Type": "application/json"}) as r:
                assert r.status == 400, await r.text()
                assert "content-encoding" in (await r.json())["error"]["message"].lower()
        # the honest case still works: a gzip body that is gzip
        body = gzip.compress(json.dumps({"content": "def f(x): return x"}).encode())
        async with s.post(eng.base + "/tokenize", data=body, headers={"Content-Encoding": "gzip"}) as r:
            assert r.status == 200 and (await r.json())["tokens"]
        await serves_on(s, eng)


def raw_exchange(port: int, data: bytes, deadline_s: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=deadline_s) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


PARSER_ERRORS = [
    ("bad content-length", b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n"),
    ("bad chunk size", b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    ("header too long", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"),
    ("not http", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n"),
]


@pytest.mark.parametrize("name, data", PARSER_ERRORS, ids=[c[0] for c in PARSER_ERRORS])
def test_parser_errors_are_json_and_one_log_line(eng, name, data):
    before = eng.output().count("bad HTTP request")
    reply = raw_exchange(eng.port, data)
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert 400 <= status < 500, reply[:300]
    assert b"application/json" in head, reply[:300]
    err = json.loads(body)["error"]
    assert err["code"] == status and err["message"]
    deadline = time.monotonic() + 10
    while eng.output().count("bad HTTP request") == before:  # stderr reaches the log file a moment later
        assert time.monotonic() < deadline, "no log line for a parser error"
        time.sleep(0.05)
    line = [ln for ln in eng.output().splitlines() if "bad HTTP request" in ln][-1]
    assert "\n" not in line and len(line) < 2000


def test_no_traceback_was_logged(eng):
    # last in the module: every refusal above was one line at most
    assert "Traceback" not in eng.output(), eng.output()[-3000:]
