"""The engine's HTTP API over a real engine child (CPU backend, tiny model), driven with aiohttp."""

import json

import aiohttp
import pytest

PROMPT = "def fibonacci(n):\n    if n < 2:"


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "--metrics", "--alias", "tiny", "-np", "4")


async def post(eng, path, body, **kw):
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body, headers=eng.headers, **kw) as r:
        return r.status, await r.json(content_type=None)


async def get(eng, path):
    async with aiohttp.ClientSession() as s, s.get(eng.base + path, headers=eng.headers) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.text())


async def sse(eng, path, body):
    """The `data:` payloads of a streamed response, in order ([DONE] as the string)."""
    out = []
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body, headers=eng.headers) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_health_props_slots(eng):
    assert await get(eng, "/health") == (200, {"status": "ok"})
    status, props = await get(eng, "/props")
    assert status == 200
    assert props["n_ctx"] == 4096 and props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 1024  # 4096 split between 4 slots
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8
    assert props["model_path"].endswith("llama-noeos")
    assert "<|im_start|>" in props["chat_template"]
    assert props["build_info"].startswith("b0-lockstep-")  # llama-server's shape
    assert props["lockstep_build"].startswith("lockstep ")
    assert props["exact_concurrency"]["granted"] is False
    status, slots = await get(eng, "/slots")
    assert status == 200 and [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 1024 and s["is_processing"] is False and "n_preempt" in s for s in slots)


async def test_metrics_are_prometheus_text(eng):
    status, text = await get(eng, "/metrics")
    assert status == 200
    for name in ("pages_total", "pages_free", "pages_used", "parks_total", "restores_total", "recomputes_total",
                 "prompt_tokens_total", "tokens_predicted_total", "requests_total"):
        assert f"\nlockstep:{name} " in "\n" + text, name
    assert eng.metrics()["pages_total"] == 16


async def test_models_answers_any_name(eng):
    status, body = await get(eng, "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == ["tiny"]
    status, body = await get(eng, "/v1/models/gpt-4o")
    assert status == 200 and body["id"] == "gpt-4o"


async def test_tokenize_detokenize_apply_template(eng):
    status, body = await post(eng, "/tokenize", {"content": "Hello world"})
    assert status == 200 and body["tokens"] and 0 not in body["tokens"]
    ids = body["tokens"]
    _, with_bos = await post(eng, "/tokenize", {"content": "Hello world", "add_special": True})
    assert with_bos["tokens"][-len(ids):] == ids  # the tiny tokenizer adds no BOS of its own
    _, pieces = await post(eng, "/tokenize", {"content": "Hello 東", "with_pieces": True})
    assert all(set(p) == {"id", "piece"} for p in pieces["tokens"])
    assert any(isinstance(p["piece"], list) for p in pieces["tokens"])  # 東 spelt in bytes
    assert await post(eng, "/detokenize", {"tokens": ids}) == (200, {"content": "Hello world"})
    status, body = await post(eng, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200
    assert body["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


async def test_completion_plain_and_streamed_agree(eng):
    req = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "cache_prompt": False}
    status, body = await post(eng, "/completion", {**req, "return_tokens": True})
    assert status == 200
    assert len(body["tokens"]) == body["tokens_predicted"] == 24
    assert body["stop"] is True and body["stop_type"] == "limit"
    assert body["preempt"] == {"parks": 0, "restores": 0}
    assert isinstance(body["seed"], int)
    assert {"prompt_ms", "predicted_ms", "predicted_per_second", "prompt_per_second"} <= set(body["timings"])
    _, detok = await post(eng, "/detokenize", {"tokens": body["tokens"]})
    assert body["content"] == detok["content"]

    chunks = await sse(eng, "/completion", {**req, "stream": True})
    assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] == "limit"
    assert "".join(c["content"] for c in chunks) == body["content"]
    assert [t for c in chunks[:-1] for t in c["tokens"]] == body["tokens"]


async def test_completion_token_prompt_and_probabilities(eng):
    _, tok = await post(eng, "/tokenize", {"content": PROMPT, "add_special": True})
    status, body = await post(eng, "/completion", {"prompt": tok["tokens"], "n_predict": 6, "temperature": 0,
                                                   "n_probs": 3, "return_tokens": True})
    assert status == 200
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == body["tokens"]
    for p in probs:
        assert len(p["top_logprobs"]) == 3
        assert p["top_logprobs"][0]["id"] == p["id"] and p["top_logprobs"][0]["logprob"] == p["logprob"]
        assert p["logprob"] <= 0 and isinstance(p["bytes"], list)


async def test_seed_is_returned_and_replays(eng):
    req = {"prompt": PROMPT, "n_predict": 16, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
           "return_tokens": True}
    _, first = await post(eng, "/completion", req)
    _, again = await post(eng, "/completion", {**req, "seed": first["seed"]})
    assert again["seed"] == first["seed"] and again["tokens"] == first["tokens"]
    _, fixed = await post(eng, "/completion", {**req, "seed": 42})
    assert fixed["seed"] == 42


async def test_stop_string_spanning_tokens(eng):
    req = {"prompt": PROMPT, "n_predict": 32, "temperature": 0}
    _, full = await post(eng, "/completion", req)
    text = full["content"].replace("\ufffd", "")
    assert len(text) > 8
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = full["content"][: full["content"].index(stop)]
    _, cut = await post(eng, "/completion", {**req, "stop": [stop]})
    assert cut["content"] == expected
    assert cut["stop_type"] == "word" and cut["stopping_word"] == stop
    chunks = await sse(eng, "/completion", {**req, "stop": stop, "stream": True})
    assert "".join(c["content"] for c in chunks) == expected
    assert chunks[-1]["stop_type"] == "word"


async def test_prompt_cache_reuses_the_prefix(eng):
    req = {"prompt": PROMPT * 4, "n_predict": 4, "temperature": 0, "return_tokens": True}
    _, first = await post(eng, "/completion", req)
    _, second = await post(eng, "/completion", req)
    assert second["tokens_cached"] > 0 and second["timings"]["cache_n"] == second["tokens_cached"]
    assert second["tokens"] == first["tokens"]


async def test_zero_tokens_asked_gives_an_empty_completion(eng):
    status, body = await post(eng, "/completion", {"prompt": PROMPT, "n_predict": 0})
    assert status == 200 and body["content"] == "" and body["tokens"] == [] and body["stop_type"] == "limit"


async def test_unknown_route_is_a_json_404(eng):
    status, body = await post(eng, "/v1/embeddings", {"input": "x"})
    assert status == 404 and body["error"]["code"] == 404


async def test_api_key_guards_everything_but_health(engine_factory, tiny_llama_noeos):
    keyed = engine_factory(tiny_llama_noeos, api_key="sekret")
    async with aiohttp.ClientSession() as s:
        async with s.get(keyed.base + "/health") as r:
            assert r.status == 200
        for path in ("/props", "/v1/models", "/slots"):
            async with s.get(keyed.base + path) as r:
                assert r.status == 401
                assert (await r.json())["error"]["type"] == "authentication_error"
        async with s.post(keyed.base + "/completion", json={"prompt": "x", "n_predict": 1},
                          headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with s.post(keyed.base + "/completion", json={"prompt": "x", "n_predict": 1},
                          headers={"Authorization": "Bearer sekret"}) as r:
            assert r.status == 200


async def test_unsupported_sampling_fields_at_their_neutral_values_are_accepted(eng):
    status, body = await post(eng, "/completion", {"prompt": PROMPT, "n_predict": 2, "mirostat": 0, "typical_p": 1.0,
                                                   "logit_bias": {}, "grammar": "", "ignore_eos": False})
    assert status == 200 and body["tokens_predicted"] == 2
