"""Endpoints llama-server has (issues 27/34): /v1/responses (official openai client, plain and streamed),
/infill, and /slots/{id}?action=save|restore|erase restoring a prompt cache exactly."""

import aiohttp
import pytest
from openai import OpenAI

PROMPT = "def fibonacci(n):\n    if n < 2:"
MESSAGES = [{"role": "system", "content": "Book"}, {"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos, tmp_path_factory):
    return engine_factory(tiny_llama_noeos, "-np", "2", "--slot-save-path", str(tmp_path_factory.mktemp("slots")))


async def post(eng, path, body=None):
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body) as r:
        return r.status, await r.json(content_type=None)


def test_responses_api_with_the_openai_client(eng):
    client = OpenAI(api_key="x", base_url=eng.base + "/v1")
    chat = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6, temperature=0)
    res = client.responses.create(model="m", input=MESSAGES, max_output_tokens=6, temperature=0)
    assert res.id.startswith("resp_") and res.output[0].id.startswith("msg_")
    assert res.output_text == chat.choices[0].message.content
    assert res.usage.input_tokens == chat.usage.prompt_tokens and res.usage.output_tokens == 6
    count = client.responses.input_tokens.count(model="m", input=MESSAGES)
    assert count.input_tokens == res.usage.input_tokens  # /v1/responses/input_tokens, nothing generated
    events = list(client.responses.create(model="m", input=MESSAGES, max_output_tokens=6, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == res.output_text
    assert {e.item_id for e in events if e.type == "response.output_text.delta"} == {events[-1].response.output[0].id}


async def test_infill_checks_input_then_needs_fim_tokens(eng):
    base = {"input_prefix": "def f():\n", "input_suffix": "\n", "prompt": "    return"}
    for extra in ({}, {"filename": 123, "text": "abc"}, {"filename": "ok"}):
        status, out = await post(eng, "/infill", {**base, "input_extra": [extra]})
        assert status == 400 and "input_extra[0]" in out["error"]["message"], extra
    status, out = await post(eng, "/infill", base)
    assert status == 501 and "fill-in-the-middle" in out["error"]["message"]  # the tiny llama has no FIM tokens


async def test_slot_save_restore_erase_is_exact(engine_factory, tiny_llama_noeos, tmp_path):
    eng = engine_factory(tiny_llama_noeos, "-np", "2", "--slot-save-path", str(tmp_path), "--exact-concurrency", "on",
                         "--kv-unified")
    body = {"prompt": PROMPT * 4, "n_predict": 6, "temperature": 0, "n_probs": 1, "cache_prompt": True}
    status, first = await post(eng, "/completion", {**body, "id_slot": 1})
    assert status == 200 and first["timings"]["cache_n"] == 0
    status, saved = await post(eng, "/slots/1?action=save", {"filename": "s1.bin"})
    assert status == 200 and saved["n_saved"] > 0
    status, erased = await post(eng, "/slots/1?action=erase")
    assert status == 200 and erased["n_erased"] == saved["n_saved"]
    status, restored = await post(eng, "/slots/0?action=restore", {"filename": "s1.bin"})
    assert status == 200 and restored["n_restored"] == saved["n_saved"]
    status, again = await post(eng, "/completion", {**body, "id_slot": 0})
    assert status == 200 and again["timings"]["cache_n"] > 0  # the restored cache was used
    assert again["content"] == first["content"]
    assert [p["logprob"] for p in again["completion_probabilities"]] == \
        [p["logprob"] for p in first["completion_probabilities"]]  # the restored KV serves it bit for bit
    for bad in ({"filename": "../x"}, {"filename": "nope.bin"}):
        status, out = await post(eng, "/slots/0?action=restore", bad)
        assert status == 400 and "filename" in out["error"]["message"]
    status, out = await post(eng, "/slots/0?action=explode", {"filename": "s1.bin"})
    assert status == 400
