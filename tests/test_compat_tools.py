"""Forced tool calls (issue 27): `tool_choice: "required"` or a named function makes the answer a call to a
declared tool, through a grammar in the template's call format; the random tiny model writes it, the real
`openai` client reads it back as `tool_calls`."""

import json

import openai
import pytest
from openai import OpenAI

from engine.grammar import compile_grammar
from engine.server.chat_output import parse_tool_calls
from engine.tool_grammar import call_style, tool_call_grammar

HERMES = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
          "{% if tools %}Answer with <tool_call>{json}</tool_call>.\n{% endif %}<|assistant|>")
THINKING = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|><think>\n"
# bounded arguments (an enum and an integer): a random model fills a free string until the limit
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
USER = [{"role": "user", "content": "weather?"}]


def client_of(eng) -> OpenAI:
    return OpenAI(api_key="x", base_url=eng.base + "/v1")


@pytest.fixture(scope="module")
def hermes(engine_factory, tiny_llama_noeos, tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "hermes.jinja"
    path.write_text(HERMES)
    return engine_factory(tiny_llama_noeos, "--chat-template-file", str(path))


def check_weather(call) -> None:
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome") and isinstance(args["days"], int)


def test_required_answers_with_a_call(hermes):
    out = client_of(hermes).chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="required",
                                                    max_tokens=200, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    check_weather(choice.message.tool_calls[0])
    free = client_of(hermes).chat.completions.create(model="m", messages=USER, tools=[WEATHER], max_tokens=12,
                                                     temperature=0)
    assert free.choices[0].message.tool_calls is None  # 'auto': the random model writes no call by itself


def test_named_function_is_the_one_called_also_streamed(hermes):
    body = dict(model="m", messages=USER, tools=[WEATHER, TIME], max_tokens=200, temperature=0.9, seed=3,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    out = client_of(hermes).chat.completions.create(**body)
    calls = out.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")
    chunks = list(client_of(hermes).chat.completions.create(**body, stream=True))
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.arguments for tc in streamed] == [calls[0].function.arguments]  # same seed, same call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("extra,needle", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "names function 'get_time', which is not in 'tools' (declared: get_weather)"),
    ({"tool_choice": "required"}, "needs at least one function in 'tools'"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "'tool_choice' must be"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "tuple"}}}],
      "tool_choice": "required"}, "'tools': function 'f' parameters.type must be one of"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": False}}], "tool_choice": "required"},
     "'tools': function 'f' parameters must be an object, not bool"),
])
def test_bad_tool_choice_is_a_400(hermes, extra, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client_of(hermes).chat.completions.create(model="m", messages=USER, max_tokens=4, **extra)
    assert e.value.status_code == 400 and needle in e.value.body["message"]


def test_open_reasoning_block_is_closed_before_the_call(engine_factory, tiny_llama_noeos, tmp_path):
    path = tmp_path / "think.jinja"
    path.write_text(THINKING)
    eng = engine_factory(tiny_llama_noeos, "--chat-template-file", str(path))
    out = client_of(eng).chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="required",
                                                 max_tokens=200, temperature=0)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1
    check_weather(msg.tool_calls[0])  # the bare-JSON form: this template names no call format
    chunks = list(client_of(eng).chat.completions.create(model="m", messages=USER, tools=[WEATHER], stream=True,
                                                         tool_choice="required", max_tokens=200, temperature=0))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(tc.function.name, tc.function.arguments) for tc in streamed] == [
        (msg.tool_calls[0].function.name, msg.tool_calls[0].function.arguments)]
    assert not any(d.content for d in deltas)  # neither the closing tag nor the call leaks as text
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def _accepts(source: str, text: str) -> bool:
    g = compile_grammar(source)
    st = g.start()
    for ch in text:
        st = g.step(st, ch)
        if not st:
            return False
    return () in st


@pytest.mark.parametrize("style,text", [
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]'),
    ("json", '{"name": "get_time", "parameters": {"zone": "UTC"}}'),
])
def test_each_style_is_what_the_parser_reads(style, text):
    source = tool_call_grammar([WEATHER, TIME], style, parallel=False)
    assert _accepts(source, text)
    assert not _accepts(source, text.replace("UTC", "PST"))  # the arguments follow the schema
    assert not _accepts(source, text.replace("get_time", "get_date"))
    content, calls = parse_tool_calls(text, [WEATHER, TIME])
    assert content is None and [c["function"]["name"] for c in calls] == ["get_time"]


def test_parallel_calls_and_style_choice():
    one = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    assert _accepts(tool_call_grammar([TIME], "hermes", parallel=True), one + "\n" + one)
    assert not _accepts(tool_call_grammar([TIME], "hermes", parallel=False), one + "\n" + one)
    assert call_style("{{ '<tool_call>' }}") == "hermes" and call_style("[TOOL_CALLS]") == "mistral"
    assert call_style("{{ messages }}") == "json"
