"""Bad requests: each gets a 4xx JSON error naming the fault, and the server keeps serving."""

import asyncio
import json

import aiohttp
import pytest

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
NATIVE = "/completion"
USER = [{"role": "user", "content": "hi"}]

# (name, endpoint, body: dict -> JSON, or bytes as sent, expected status, text in the message)
BAD = [
    ("malformed json", NATIVE, b'{"prompt": "x",', 400, "not valid JSON"),
    ("json not an object", NATIVE, b'["prompt"]', 400, "must be a JSON object"),
    ("empty body", CHAT, b"", 400, "body is empty"),
    ("invalid utf-8", NATIVE, b'{"prompt": "\xff\xfe"}', 400, "not valid UTF-8"),
    ("NaN literal", NATIVE, b'{"prompt": "x", "temperature": NaN}', 400, "NaN is not valid JSON"),
    ("prompt missing", NATIVE, {"n_predict": 4}, 400, "'prompt' is required"),
    ("prompt wrong type", NATIVE, {"prompt": 42}, 400, "'prompt' must be a string, an array"),
    ("empty prompt", NATIVE, {"prompt": ""}, 400, "'prompt' is empty"),
    ("empty token list", CMPL, {"prompt": []}, 400, "'prompt' is empty"),
    ("unknown token id", NATIVE, {"prompt": [5, 99999]}, 400, "unknown token id 99999"),
    ("negative token id", CMPL, {"prompt": [5, -1]}, 400, "unknown token id -1"),
    ("token id not int", CMPL, {"prompt": [5, "x", 7]}, 400, "'prompt[1]' must be a token id"),
    ("several prompts", CMPL, {"prompt": ["a", "b"]}, 400, "holds 2 prompts"),
    ("prompt longer than the context", NATIVE, {"prompt": "hello world " * 2000}, 400, "exceeds the available context size"),
    ("negative n_predict", NATIVE, {"prompt": "x", "n_predict": -5}, 400, "'n_predict' must be >= -1"),
    ("huge n_predict", NATIVE, {"prompt": "x", "n_predict": 10**12}, 400, "'n_predict' must be <="),
    ("n_predict as string", NATIVE, {"prompt": "x", "n_predict": "10"}, 400, "must be an integer"),
    ("max_tokens float", CMPL, {"prompt": "x", "max_tokens": 2.5}, 400, "'max_tokens' must be an integer"),
    ("n zero", CMPL, {"prompt": "x", "n": 0}, 400, "'n' must be >= 1"),
    ("n negative", CHAT, {"messages": USER, "n": -1}, 400, "'n' must be >= 1"),
    ("n too large", CHAT, {"messages": USER, "n": 17}, 400, "'n' must be <= 16"),
    ("n more than slots", CHAT, {"messages": USER, "n": 3}, 400, "n=3 needs between 1 and 2 slots"),
    ("n not an int", CMPL, {"prompt": "x", "n": "two"}, 400, "'n' must be an integer"),
    ("n boolean", CMPL, {"prompt": "x", "n": True}, 400, "'n' must be an integer, not a boolean"),
    ("stop item not a string", CHAT, {"messages": USER, "stop": ["a", 3]}, 400, "'stop[1]' must be a string"),
    ("too many stops", CMPL, {"prompt": "x", "stop": [str(i) for i in range(17)]}, 400, "at most 16"),
    ("empty stop", NATIVE, {"prompt": "x", "stop": [""]}, 400, "'stop[0]' is empty"),
    ("stop wrong type", NATIVE, {"prompt": "x", "stop": {"a": 1}}, 400, "'stop' must be a string or an array"),
    ("negative temperature", CHAT, {"messages": USER, "temperature": -0.5}, 400, "'temperature' must be >= 0"),
    ("temperature string", CMPL, {"prompt": "x", "temperature": "hot"}, 400, "'temperature' must be a number"),
    ("top_p above 1", NATIVE, {"prompt": "x", "top_p": 1.5}, 400, "'top_p' must be <= 1"),
    ("repeat_penalty zero", NATIVE, {"prompt": "x", "repeat_penalty": 0}, 400, "'repeat_penalty' must be > 0"),
    ("seed too large", NATIVE, {"prompt": "x", "seed": 2**64}, 400, "'seed' must be <="),
    ("logprobs negative", CMPL, {"prompt": "x", "logprobs": -2}, 400, "'logprobs' must be >= 0"),
    ("logprobs too many", CMPL, {"prompt": "x", "logprobs": 50}, 400, "'logprobs' must be <= 20"),
    ("chat logprobs not bool", CHAT, {"messages": USER, "logprobs": 3}, 400, "'logprobs' must be true or false"),
    ("top_logprobs without logprobs", CHAT, {"messages": USER, "top_logprobs": 2}, 400, "needs 'logprobs': true"),
    ("n_probs too many", NATIVE, {"prompt": "x", "n_probs": 100}, 400, "'n_probs' must be <= 20"),
    ("messages missing", CHAT, {"model": "m"}, 400, "'messages' is required"),
    ("messages empty", CHAT, {"messages": []}, 400, "'messages' is empty"),
    ("messages not a list", CHAT, {"messages": "hi"}, 400, "'messages' must be an array"),
    ("message not an object", CHAT, {"messages": ["hi"]}, 400, "'messages[0]' must be an object"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "'messages[0].role' 'wizard'"),
    ("content wrong type", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "must be a string or an array"),
    ("user content missing", CHAT, {"messages": [{"role": "user"}]}, 400, "'messages[0].content' is required"),
    ("image content", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, "content type 'image_url' is not supported"),
    ("tools", CHAT, {"messages": USER, "tools": {"type": "function"}}, 400, "'tools' must be an array"),
    ("logit_bias", CMPL, {"prompt": "x", "logit_bias": {"5": "x"}}, 400, "must be a finite number"),
    ("logit_bias id", CMPL, {"prompt": "x", "logit_bias": [[1 << 20, 1]]}, 400, "unknown token id"),
    ("grammar", NATIVE, {"prompt": "x", "grammar": "root ::= (unclosed"}, 400, "a '(' is not closed"),
    ("mirostat", NATIVE, {"prompt": "x", "mirostat": 2}, 400, "'mirostat' is not supported yet"),
    ("json schema", CHAT, {"messages": USER, "response_format": {"type": "json_object", "schema": {"type": "hiccup"}}},
     400, "schema.type must be one of"),
    ("response format", CHAT, {"messages": USER, "response_format": {"type": "sound"}}, 400,
     "'response_format' type 'sound' is not supported"),
    ("stream not a bool", NATIVE, {"prompt": "x", "stream": "yes"}, 400, "'stream' must be true or false"),
    ("id_slot out of range", NATIVE, {"prompt": "x", "id_slot": 9}, 400, "'id_slot' must be <= 1"),
    ("detokenize bad id", "/detokenize", {"tokens": [1, 10**9]}, 400, "unknown token id"),
    ("tokenize without content", "/tokenize", {"add_special": True}, 400, "'content' is required"),
    ("wrong method", "/health", {"x": 1}, 405, "Method Not Allowed"),
]


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    # no --metrics, -c 0: the model's native context (8192) split between two slots
    return engine_factory(tiny_llama_noeos, "-np", "2", "-c", "0")


@pytest.mark.parametrize("name, path, body, status, needle", BAD, ids=[b[0] for b in BAD])
async def test_bad_request_is_a_json_error_and_the_server_serves_on(eng, name, path, body, status, needle):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as s:
        async with s.post(eng.base + path, data=data, headers={"Content-Type": "application/json"}) as r:
            assert r.status == status, await r.text()
            err = (await r.json())["error"]
        assert err["code"] == status and err["type"] and needle in err["message"], err
        async with s.post(eng.base + NATIVE, json={"prompt": "ok", "n_predict": 2}) as r:
            assert r.status == 200 and (await r.json())["tokens_predicted"] == 2


def test_table_is_large_enough():
    assert len(BAD) >= 20


async def test_metrics_need_the_flag_and_native_context_is_used(eng):
    async with aiohttp.ClientSession() as s:
        async with s.get(eng.base + "/metrics") as r:
            assert r.status == 501 and "--metrics" in (await r.json())["error"]["message"]
        async with s.get(eng.base + "/props") as r:
            props = await r.json()
    assert props["n_ctx"] == 8192 and props["default_generation_settings"]["n_ctx"] == 4096


async def test_full_queue_answers_503_and_the_server_recovers(engine_factory, tiny_llama_noeos):
    busy = engine_factory(tiny_llama_noeos, "-np", "1")
    body = {"prompt": "hello", "n_predict": 100000, "cache_prompt": False}
    async with aiohttp.ClientSession() as s:

        async def one():
            async with s.post(busy.base + NATIVE, json=body) as r:
                return r.status, await r.json()

        tasks = [asyncio.create_task(one()) for _ in range(80)]
        done, pending = set(), set(tasks)
        refused = []
        while not refused:
            done, pending = await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            assert done, "no request finished or was refused"
            refused = [t.result() for t in done if t.result()[0] == 503]
        for t in pending:
            t.cancel()  # the client goes away: the engine aborts what it queued and ran
        await asyncio.gather(*pending, return_exceptions=True)
        assert "queue is full" in refused[0][1]["error"]["message"]
        assert refused[0][1]["error"]["type"] == "unavailable_error"
        # the aborts land at the compute thread's next step: the queue drains within moments
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            async with s.post(busy.base + NATIVE, json={"prompt": "ok", "n_predict": 2}) as r:
                if r.status == 200:
                    break
                assert r.status == 503 and asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
