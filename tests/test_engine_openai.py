"""The official `openai` client against a real engine child: completions and chat, plain and streamed,
n=2, logprobs, seeds. Exact mode is on, so n=2 at temperature 0 must repeat the solo completion."""

import openai
import pytest

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello world."}]
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "--exact-concurrency", "on", "--kv-unified", "-np", "4",
                          api_key="k-123")


@pytest.fixture(scope="module")
def client(eng):
    return openai.OpenAI(base_url=eng.base + "/v1", api_key="k-123", max_retries=0, timeout=60)


def test_completion_plain(client):
    r = client.completions.create(model="anything", prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.model == "anything" and r.object == "text_completion"
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    extra = r.model_extra
    assert isinstance(extra["seed"], int) and extra["preempt"] == {"parks": 0, "restores": 0}


def test_completion_streamed_equals_plain(client):
    plain = client.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_chat_plain_and_streamed(client):
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=16, temperature=0)
    msg = plain.choices[0].message
    assert msg.role == "assistant" and plain.choices[0].finish_reason == "length"
    assert plain.usage.completion_tokens == 16
    stream = client.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=16, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n2_at_temperature_zero_repeats_the_solo_completion(client):
    solo = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=0)
    pair = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=0, n=2)
    assert [c.index for c in pair.choices] == [0, 1]
    assert pair.choices[0].message.content == pair.choices[1].message.content == solo.choices[0].message.content
    assert pair.usage.completion_tokens == 40


def test_n2_seeded_completions_differ_and_replay(client):
    kw = dict(model="m", prompt=PROMPT, max_tokens=20, temperature=1.0, top_p=1.0, n=2, seed=7,
              extra_body={"top_k": 0, "min_p": 0.0})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.model_extra["seed"] == 7
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text


def test_n2_streamed(client):
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0, n=2,
                                                 stream=True))
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert finishes == {0: "length", 1: "length"} and texts[0] == texts[1]


def test_completion_logprobs(client):
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) <= 3 and logprob <= 0
        assert max(top.values()) == pytest.approx(logprob)  # greedy: the pick is the most likely
        assert token in top
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_streamed_and_plain_agree(client):
    kw = dict(model="m", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    plain = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(plain) == 8
    for entry in plain:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == entry.logprob
        assert isinstance(entry.bytes, list)
    streamed = [e for c in client.chat.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in plain]


def test_chat_stop_strings(client):
    full = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    clean = text.replace("\ufffd", "")
    stop = clean[len(clean) // 2 : len(clean) // 2 + 2]
    cut = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0,
                                         stop=["never-there", stop])
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_errors_raise_in_the_client(client):
    with pytest.raises(openai.BadRequestError, match="'n' must be <= 16"):
        client.chat.completions.create(model="m", messages=MESSAGES, n=17)
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_models_list(client):
    assert [m.id for m in client.models.list()] == ["llama-noeos"]
