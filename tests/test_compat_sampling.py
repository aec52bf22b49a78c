"""Sampling parameters from llama-server and OpenAI (issues 27/34): logit_bias in both forms, ignore_eos,
post-sampling probabilities, prompt progress and live timings; exact mode keeps them exact."""

import json
import math

import aiohttp
import pytest

PROMPT = "def fibonacci(n):\n    if n < 2:"


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama):
    return engine_factory(tiny_llama, "--exact-concurrency", "on", "--kv-unified", "-np", "4", "-b", "8")


async def post(eng, path, body):
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body) as r:
        return r.status, await r.json(content_type=None)


async def stream(eng, path, body):
    out = []
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


async def first_tokens(eng, **extra):
    status, out = await post(eng, "/completion", {"prompt": PROMPT, "n_predict": 4, "temperature": 0,
                                                  "return_tokens": True, **extra})
    assert status == 200, out
    return out["tokens"], out


async def test_logit_bias_forms_ban_the_greedy_token(eng):
    base, _ = await first_tokens(eng)
    t = base[0]
    for bias in ({str(t): -100}, [[t, False]], [[t, -1e9]]):
        got, out = await first_tokens(eng, logit_bias=bias)
        assert got[0] != t, bias
        assert got == (await first_tokens(eng, logit_bias=bias))[0]  # a function of the request alone
    text_ids = (await post(eng, "/tokenize", {"content": " return n"}))[1]["tokens"]
    _, out = await first_tokens(eng, logit_bias=[[" return n", False]])  # a text key bans each of its tokens
    assert out["generation_settings"]["logit_bias"] == [{"bias": None, "token": i} for i in text_ids]
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1, "temperature": 0, "logprobs": True}
    first = (await post(eng, "/v1/chat/completions", chat))[1]["choices"][0]["logprobs"]["content"][0]
    ids = (await post(eng, "/tokenize", {"content": first["token"], "with_pieces": True}))[1]["tokens"]
    ban = {str(ids[0]["id"]): -100} if len(ids) == 1 else {}
    status, out = await post(eng, "/v1/chat/completions", {**chat, "logit_bias": ban})
    assert status == 200 and (not ban or out["choices"][0]["logprobs"]["content"][0]["bytes"] != first["bytes"])


async def test_logit_bias_exact_beside_neighbours(eng):
    import asyncio

    bias = [[5, 3.5], [7, False]]
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0.9, "seed": 7, "n_probs": 2, "logit_bias": bias}
    solo = (await post(eng, "/completion", body))[1]
    together = await asyncio.gather(post(eng, "/completion", body),
                                    *(post(eng, "/completion", {"prompt": PROMPT * (i + 1), "n_predict": 8})
                                      for i in range(3)))
    busy = together[0][1]
    assert busy["content"] == solo["content"]
    assert [p["logprob"] for p in busy["completion_probabilities"]] == \
        [p["logprob"] for p in solo["completion_probabilities"]]  # bit for bit


async def test_ignore_eos_bans_end_of_generation(eng):
    _, out = await first_tokens(eng, ignore_eos=True)
    bans = out["generation_settings"]["logit_bias"]
    assert bans and all(b["bias"] is None for b in bans)
    assert 1 in {b["token"] for b in bans}  # the tiny llama's </s>
    _, out = await first_tokens(eng, ignore_eos=False)
    assert out["generation_settings"]["logit_bias"] == []


async def test_post_sampling_probs(eng):
    body = {"prompt": PROMPT, "n_predict": 5, "n_probs": 10, "temperature": 1.0, "top_k": 4, "seed": 3,
            "post_sampling_probs": True}
    status, out = await post(eng, "/completion", body)
    assert status == 200
    for tok in out["completion_probabilities"]:
        assert 0.0 < tok["prob"] <= 1.0 and "logprob" not in tok
        probs = [p["prob"] for p in tok["top_probs"]]
        assert len(probs) == 4 and math.isclose(sum(probs), 1.0, rel_tol=1e-9)  # top_k kept 4
        assert tok["id"] in [p["id"] for p in tok["top_probs"]]
    assert (await post(eng, "/completion", body))[1]["completion_probabilities"] == out["completion_probabilities"]


async def test_progress_and_timings_per_token(eng):
    chunks = await stream(eng, "/completion", {"prompt": PROMPT * 3, "n_predict": 3, "stream": True,
                                               "return_progress": True, "timings_per_token": True,
                                               "cache_prompt": False})
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert len(progress) > 2  # -b 8: the prompt goes in several chunks
    assert progress[0]["processed"] == progress[0]["cache"] == 0
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert progress[-1]["processed"] == progress[-1]["total"]
    tokens = [c for c in chunks if c.get("content")]
    assert tokens and all("predicted_per_second" in c["timings"] for c in tokens)
    chat = await stream(eng, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                      "max_tokens": 2, "stream": True, "return_progress": True})
    assert any("prompt_progress" in c for c in chat)


async def test_timings_rate_excludes_first_token(eng):
    _, one = await first_tokens(eng, n_predict=1)
    assert one["timings"]["predicted_per_second"] == 0.0 and one["timings"]["predicted_per_token_ms"] == 0.0
    _, many = await first_tokens(eng, n_predict=6, cache_prompt=False)
    t = many["timings"]
    assert t["predicted_n"] == 6 and math.isclose(t["predicted_per_second"], 5 * 1000 / t["predicted_ms"])
    assert t["prompt_per_token_ms"] > 0 and math.isclose(t["prompt_per_token_ms"], t["prompt_ms"] / t["prompt_n"])


@pytest.mark.parametrize("body,check,ends", [
    ({"grammar": 'root ::= "ab"{3,3}'}, lambda text: text == "ababab", "eos"),
    ({"json_schema": {"const": "42"}}, lambda text: text.strip() == '"42"', None),
    # whitespace may follow the object until the limit: the answer still parses
    ({"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
     lambda text: isinstance(json.loads(text)["n"], int), None),
])
async def test_grammar_and_schema_constrain_the_answer(eng, body, check, ends):
    req = {"prompt": PROMPT, "n_predict": 24, "temperature": 0.8, "seed": 5, "return_tokens": True, **body}
    status, out = await post(eng, "/completion", req)
    assert status == 200, out
    assert check(out["content"]), out["content"]
    assert ends is None or out["stop_type"] == ends  # the grammar completed: only the end of generation was left
    assert (await post(eng, "/completion", req))[1]["tokens"] == out["tokens"]  # a function of the request


async def test_response_format_on_chat(eng):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 40, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["yes", "no"]}}}}
    status, out = await post(eng, "/v1/chat/completions", body)
    assert status == 200 and json.loads(out["choices"][0]["message"]["content"]) in ("yes", "no")


def test_gbnf_forms():
    from engine.grammar import Grammar, GrammarError

    def accepts(g, text):
        st = g.start()
        for ch in text:
            st = g.step(st, ch)
        return () in st

    g = Grammar('root ::= item ("," item)*\nitem ::= [a-c]+ | "x" [0-9]{1,2} # comment\n')
    assert accepts(g, "ab,x1,c") and accepts(g, "x12") and not accepts(g, "x123") and not accepts(g, "ab,")
    for bad in ('root ::= "a" (', "root ::= undefined", 'other ::= "a"', "root ::= root \"a\""):
        with pytest.raises(GrammarError):
            Grammar(bad)
