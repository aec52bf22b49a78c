"""Chat templates and answers as llama-server renders and parses them (issues 27/34): tools and kwargs into
the template, assistant prefill, reasoning on/off, tool calls and <think> blocks back out of the text."""

import json

import aiohttp
import pytest
from openai import OpenAI

from engine.server.chat_output import ReasoningSplitter, parse_tool_calls

TEMPLATE = (
    "{{ bos_token }}{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if m.tool_calls %}CALLS:{% for c in m.tool_calls %}"
    "{{ c.function.name }}({{ c.function.arguments.x }}){% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}{{ custom | default('') }}"
)
THINKING = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|><think>\n"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos, tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "t.jinja"
    path.write_text(TEMPLATE)
    return engine_factory(tiny_llama_noeos, "--chat-template-file", str(path))


@pytest.fixture(scope="module")
def thinking(engine_factory, tiny_llama_noeos, tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "think.jinja"
    path.write_text(THINKING)
    return path


async def post(eng, path, body):
    async with aiohttp.ClientSession() as s, s.post(eng.base + path, json=body) as r:
        return r.status, await r.json(content_type=None)


async def prompt_of(eng, body):
    status, out = await post(eng, "/apply-template", body)
    assert status == 200, out
    return out["prompt"]


async def test_tools_and_kwargs_reach_the_template(eng):
    assert "TOOLS:get_weather;" in await prompt_of(eng, {"messages": USER, "tools": [TOOL]})
    assert "TOOLS" not in await prompt_of(eng, {"messages": USER, "tools": [TOOL], "tool_choice": "none"})
    assert (await prompt_of(eng, {"messages": USER, "chat_template_kwargs": {"custom": "XYZ"}})).endswith("XYZ")
    history = USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"x\": 5}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert "CALLS:get_weather(5)" in await prompt_of(eng, {"messages": history})  # arguments as a mapping
    assert "TOOLS:get_weather;" in await prompt_of(eng, {"messages": USER, "tool_choice": "required", "tools": [TOOL]})


async def test_prefill_and_continue_final_message(eng):
    msgs = USER + [{"role": "assistant", "content": "Whi"}]
    prefill = await prompt_of(eng, {"messages": msgs})
    assert prefill.endswith("<|user|>hi\n<|assistant|>Whi")
    assert await prompt_of(eng, {"messages": msgs, "add_generation_prompt": False,
                                 "continue_final_message": True}) == prefill
    assert (await prompt_of(eng, {"messages": USER, "add_generation_prompt": False})).endswith("<|user|>hi\n")
    for body in ({"messages": msgs, "add_generation_prompt": True, "continue_final_message": True},
                 {"messages": msgs + [{"role": "assistant", "content": "x"}]},
                 {"messages": USER, "continue_final_message": True}):
        status, out = await post(eng, "/v1/chat/completions", body)
        assert status == 400 and "error" in out, body


async def test_token_count_verbose_and_stream_shape(eng):
    body = {"messages": USER, "max_tokens": 4, "temperature": 0}
    status, count = await post(eng, "/chat/completions/input_tokens", body)
    status2, out = await post(eng, "/v1/chat/completions", {**body, "verbose": True})
    assert status == status2 == 200
    assert count["input_tokens"] == out["usage"]["prompt_tokens"]
    assert out["__verbose"]["prompt"].endswith("<|user|>hi\n<|assistant|>")
    client = OpenAI(api_key="x", base_url=eng.base + "/v1")
    chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=4, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    last = chunks[-1].choices[0]
    assert last.finish_reason == "length" and last.delta.content is None  # an empty delta ends it
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == out["choices"][0]["message"]["content"]


async def test_reasoning_off_closes_the_block_and_answers_split(engine_factory, tiny_llama_noeos, thinking):
    off = engine_factory(tiny_llama_noeos, "--chat-template-file", str(thinking), "--reasoning", "off")
    assert (await prompt_of(off, {"messages": USER})).endswith("<|assistant|><think></think>")
    on = engine_factory(tiny_llama_noeos, "--chat-template-file", str(thinking))
    body = {"messages": USER, "max_tokens": 6, "temperature": 0}
    status, chat = await post(on, "/v1/chat/completions", body)
    prompt = await prompt_of(on, {"messages": USER})
    status2, raw = await post(on, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert status == status2 == 200
    # the template opened <think>: the whole answer (it never closes it) is reasoning
    msg = chat["choices"][0]["message"]
    assert msg["reasoning_content"] == raw["choices"][0]["text"].strip() and not msg["content"]
    status, kept = await post(on, "/v1/chat/completions", {**body, "reasoning_format": "none"})
    assert kept["choices"][0]["message"]["content"] == raw["choices"][0]["text"]


# --- the parsers alone (the random tiny model cannot be made to write a tool call)
@pytest.mark.parametrize("text,content", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"x": 1}}\n</tool_call>', None),
    ('Sure. <tool_call>{"name": "get_weather", "arguments": {"x": 1}}</tool_call>', "Sure."),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"x": 1}}]', None),
    ('[TOOL_CALLS]get_weather[ARGS]{"x": 1}', None),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"x": 1}}', None),
    ('{"name": "get_weather", "parameters": {"x": 1}}', None),
])
def test_tool_call_formats(text, content):
    got, calls = parse_tool_calls(text, [TOOL])
    assert got == content and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather" and json.loads(calls[0]["function"]["arguments"]) == {"x": 1}


def test_tool_calls_only_for_declared_tools():
    text = '{"name": "other", "parameters": {}}'
    assert parse_tool_calls(text, [TOOL]) == (text, [])
    assert parse_tool_calls(text, None) == (text, [])


@pytest.mark.parametrize("pieces", [["<think>why</think>answer"], ["<th", "ink>wh", "y</thi", "nk>", "answer"]])
def test_reasoning_split_is_the_same_in_pieces(pieces):
    s = ReasoningSplitter(("<think>", "</think>"), starts_open=False)
    parts = [s.feed(p) for p in pieces] + [s.feed("", final=True)]
    assert "".join(r for r, _ in parts) == "why" and "".join(c for _, c in parts) == "answer"
