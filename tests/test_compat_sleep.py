"""--sleep-idle-seconds (issue 27), as llama-server has it: after N idle seconds the model is freed, the
read-only endpoints keep answering without waking it, the next request reloads it, and what it computes after
the reload is bit for bit what it computed before."""

import asyncio
import json
import socket
import time
import urllib.request

import aiohttp
import pytest
from openai import OpenAI

from tests.engine_helpers import run_engine

PROMPT = "def fibonacci(n):"
FREED = "sleeping after 1 s idle: the model's weights and KV cache are freed"


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "--sleep-idle-seconds", "1", "--metrics", "--exact-concurrency", "on")


def metrics_text(eng) -> str:
    with urllib.request.urlopen(eng.base + "/metrics", timeout=30) as r:
        return r.read().decode()


def metric(text: str, name: str) -> float:
    values = [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith(name + " ")]
    assert len(values) == 1, name
    return float(values[0])


def sleeping(eng) -> bool:
    return eng.get_json("/props")["is_sleeping"]


def poll(done, what: str, eng, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > end:
            raise TimeoutError(f"{what}:\n{eng.output()}")
        time.sleep(0.02)  # a poll interval, bounded by the deadline


def wait_asleep(eng, deadline_s: float = 30.0) -> None:
    """Until /props says so and the log says the model is freed (the last step of going to sleep)."""
    freed = eng.output().count(FREED)
    poll(lambda: sleeping(eng) and eng.output().count(FREED) > freed, "the engine did not go to sleep", eng,
         deadline_s)


def sample(eng):
    out = OpenAI(api_key="x", base_url=eng.base + "/v1").completions.create(
        model="m", prompt=PROMPT, max_tokens=12, temperature=0.9, seed=11, logprobs=2)
    lp = out.choices[0].logprobs
    return lp.tokens, lp.token_logprobs, lp.top_logprobs


def test_sleeps_answers_read_only_and_wakes_to_the_same_bits(eng):
    before = sample(eng)
    wait_asleep(eng)
    metrics_text(eng)  # llama.cpp's rate gauges cover the time since the previous scrape: this one resets them
    asleep_metrics = metrics_text(eng)
    assert eng.get_json("/health") == {"status": "ok"}
    models = eng.get_json("/v1/models")["data"]
    assert len(models) == 1 and models[0]["meta"]["n_vocab"] > 0
    assert eng.get_json("/v1/models/" + models[0]["id"]) == models[0]
    assert all(not s["is_processing"] for s in eng.get_json("/slots"))
    props = eng.get_json("/props")
    assert props["n_ctx"] > 0 and props["model_alias"] == models[0]["id"]
    assert metrics_text(eng) == asleep_metrics  # served from the figures taken on entering sleep
    assert sleeping(eng)  # none of those woke it
    tokens_before = metric(asleep_metrics, "lockstep:tokens_predicted_total")

    woke = eng.output().count("woke: the model is loaded again")
    after = sample(eng)  # wakes it: the model is loaded again first
    # the log, not /props: the 1 s timer may already have put it back to sleep
    poll(lambda: eng.output().count("woke: the model is loaded again") > woke, "the request did not wake it", eng)
    assert after == before  # token ids and logprobs, compared as the exact floats they are
    assert metric(metrics_text(eng), "lockstep:tokens_predicted_total") == tokens_before + 12  # counts carry on


async def test_requests_arriving_together_wake_it_once(eng):
    wait_asleep(eng)
    woke = eng.output().count("woke: the model is loaded again")
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}
    async with aiohttp.ClientSession() as s:
        async def one():
            async with s.post(eng.base + "/completion", json=body) as r:
                return r.status, (await r.json())["content"]

        results = await asyncio.gather(*(one() for _ in range(3)))
    assert [status for status, _ in results] == [200] * 3 and len({text for _, text in results}) == 1
    assert eng.output().count("woke: the model is loaded again") == woke + 1


def test_a_client_leaving_during_the_wake_leaves_one_load_that_completes(eng):
    wait_asleep(eng)
    loads, woke = eng.output().count("load progress: phase=read"), eng.output().count("woke: the model")
    body = json.dumps({"prompt": PROMPT, "n_predict": 4}).encode()
    host, port = eng.base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST /completion HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port.encode(), len(body), body))
        poll(lambda: eng.output().count("load progress: phase=read") > loads, "the wake did not start", eng)
    # the client is gone mid-load: the wake finishes all the same, and the next request finds the model awake
    poll(lambda: eng.output().count("woke: the model") > woke, "the wake was abandoned", eng)
    assert sample(eng)[0]
    assert eng.output().count("load progress: phase=read") == loads + 1  # loaded once, not again beside it


def test_tokenize_wakes_it(eng):
    wait_asleep(eng)
    woke = eng.output().count("woke: the model is loaded again")
    with urllib.request.urlopen(urllib.request.Request(eng.base + "/tokenize", data=b'{"content": "def"}',
                                                       headers={"Content-Type": "application/json"})) as r:
        assert r.status == 200
    poll(lambda: eng.output().count("woke: the model is loaded again") == woke + 1, "/tokenize did not wake it", eng)


def test_llamacpp_rates_cover_the_time_since_the_last_scrape(eng):
    metrics_text(eng)
    sample(eng)
    first = metrics_text(eng)
    assert metric(first, "llamacpp:predicted_tokens_seconds") > 0
    assert metric(metrics_text(eng), "llamacpp:predicted_tokens_seconds") == 0  # nothing ran since
    assert metric(first, "lockstep:predicted_tokens_seconds") > 0  # ours stay averages since the start


def test_the_flag_is_documented():
    out = run_engine(["--help"])
    assert out.returncode == 0 and "--sleep-idle-seconds N" in out.stdout
