"""/completion as llama-server answers it (issues 27/34): prompt forms, several prompts, return_tokens,
response_fields, truncated, and the context-exceeded error's fields."""

import aiohttp
import pytest

PROMPT = "def fibonacci(n):\n    if n < 2:"


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "-c", "512", "-np", "2")


async def post(eng, path, body):
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body) as r:
        return r.status, await r.json(content_type=None)


async def done(eng, **body):
    status, out = await post(eng, "/completion", {"n_predict": 4, "temperature": 0, **body})
    assert status == 200, out
    return out


async def test_prompt_forms_give_the_same_answer(eng):
    ids = (await post(eng, "/tokenize", {"content": PROMPT, "add_special": True}))[1]["tokens"]
    text = (await done(eng, prompt=PROMPT))["content"]
    assert (await done(eng, prompt=ids))["content"] == text
    assert (await done(eng, prompt={"prompt_string": PROMPT}))["content"] == text
    many = (await post(eng, "/completion", {"prompt": [ids, PROMPT, {"prompt_string": PROMPT}], "n_predict": 4,
                                            "temperature": 0}))[1]
    assert isinstance(many, list) and [r["content"] for r in many] == [text] * 3
    assert [r["index"] for r in many] == [0, 1, 2]
    mixed = await done(eng, prompt=[ids[0], PROMPT[:10], *ids[1:3]])  # ids and text in one prompt
    assert isinstance(mixed["content"], str)
    status, out = await post(eng, "/completion", {"prompt": {"prompt_string": "x", "multimodal_data": ["abc"]}})
    assert status == 400 and "multimodal" in out["error"]["message"]


async def test_return_tokens_and_response_fields(eng):
    assert (await done(eng, prompt=PROMPT))["tokens"] == []
    out = await done(eng, prompt=PROMPT, return_tokens=True)
    assert len(out["tokens"]) == 4 and all(isinstance(t, int) for t in out["tokens"])
    out = await done(eng, prompt=PROMPT, response_fields=["content", "generation_settings/n_predict", "prompt"])
    assert set(out) == {"content", "generation_settings/n_predict", "prompt"}
    assert out["generation_settings/n_predict"] == 4 and out["prompt"].endswith(PROMPT)


async def test_truncated_when_the_context_fills(eng):
    out = await done(eng, prompt=PROMPT, n_predict=-1)
    assert out["truncated"] is True and out["stop_type"] == "limit"
    assert out["tokens_evaluated"] + out["tokens_predicted"] == 256  # -c 512 -np 2
    assert (await done(eng, prompt=PROMPT))["truncated"] is False


async def test_context_exceeded_error_fields(eng):
    for path, body in (("/completion", {"prompt": PROMPT * 100}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT * 100}],
                                                 "stream": True})):
        status, out = await post(eng, path, body)
        assert status == 400, out
        err = out["error"]
        assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256
        assert "exceeds the available context size" in err["message"]
