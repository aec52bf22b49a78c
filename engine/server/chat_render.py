"""A chat request's prompt: the template rendered with the request's options, as llama-server renders it.

Options: `add_generation_prompt`, an assistant message at the end as a prefill (vLLM's
`continue_final_message` says so explicitly), `tools` and `chat_template_kwargs` for the template,
`tool_choice` ('required' or a named function forces a call through a grammar: engine.tool_grammar), and
reasoning (`--reasoning off` or `enable_thinking: false` renders the template's no-thinking form and
closes a thinking block the template opened; otherwise `enable_thinking` is true, as llama-server passes it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from engine.grammar import GrammarError, compile_grammar
from engine.json_schema import SchemaError
from engine.server.chat import check_messages, encode_chat, render
from engine.server.errors import bad_request
from engine.server.params import Fields, kind_of
from engine.server.state import EngineState
from engine.tool_grammar import call_style, tool_call_grammar

# (open, close) of the reasoning blocks the major families write
THINK_TAGS = (("<think>", "</think>"), ("<|START_THINKING|>", "<|END_THINKING|>"))
REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token")


@dataclass
class ChatPrompt:
    text: str
    ids: list[int] = field(default_factory=list)
    think: tuple[str, str] | None = None  # the reasoning tags to split the answer by; None leaves it whole
    thinking_open: bool = False  # the prompt ends inside a reasoning block: the answer starts as reasoning
    tools: list | None = None
    grammar: str = ""  # a forced tool call's grammar ("" leaves the answer free)


def _tools(f: Fields) -> tuple[list | None, list | None]:
    """(the tools the template sees, the ones a call is forced to: all of them under 'required', the named
    one under {"type": "function", "function": {"name": ...}}, None under 'auto')."""
    tools = f.raw("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request(f"'tools' must be an array, not {kind_of(tools)}")
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"'tools[{i}]' must be an object with function.name")
    choice = f.raw("tool_choice", "auto")
    if choice == "none":
        return None, None
    if choice == "auto":
        return tools or None, None
    if choice == "required":
        if not tools:
            raise bad_request("'tool_choice' 'required' needs at least one function in 'tools'")
        return tools, tools
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    named = [t for t in tools or [] if t["function"]["name"] == fn["name"]]
    if not named:
        declared = ", ".join(t["function"]["name"] for t in tools or []) or "none"
        raise bad_request(f"'tool_choice' names function {fn['name']!r}, which is not in 'tools' (declared: {declared})")
    return tools, named[:1]


def _forced_call(f: Fields, forced: list, template: str, open_tag: str | None) -> str:
    if f.str("grammar") or f.has("json_schema") or f.obj("response_format").raw("type", "text") != "text":
        raise bad_request("a forced tool call ('tool_choice') cannot be combined with 'grammar', 'json_schema' "
                          "or 'response_format'")
    try:
        source = tool_call_grammar(forced, call_style(template), f.bool("parallel_tool_calls", False),
                                   prefix=open_tag or "")
        compile_grammar(source)
        return source
    except (SchemaError, GrammarError) as e:
        raise bad_request(f"'tools': {e}") from None


def _context(tools: list | None) -> dict:
    """What llama-server gives every template besides the messages: the tools, today's date in the forms
    Llama 3.x and FireFunction templates read, and `functions` (the tools as JSON text)."""
    now = datetime.now()  # local time, as strftime_now
    return {"tools": tools, "date_string": now.strftime("%d %b %Y"),
            "datetime": now.strftime("%b %d %Y %H:%M:%S GMT"),
            "functions": json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""}


def _tags_in(source: str) -> tuple[str, str] | None:
    return next((t for t in THINK_TAGS if t[0] in source), None)


def _close_thinking(text: str, tags: tuple[str, str] | None) -> str:
    """Reasoning off: a block the template left open is closed; a template that knows a block but wrote
    none gets an empty one (llama-server's forms for DeepSeek-R1, QwQ, Command R7B)."""
    if tags is None:
        return text
    open_, close = tags
    stripped = text.rstrip()
    if stripped.endswith(open_):
        return text + close
    if not stripped.endswith(close):
        return text + open_ + close
    return text


async def build_prompt(state: EngineState, f: Fields, encode: bool = True) -> ChatPrompt:
    messages = check_messages(f.raw("messages"))
    add_gen = f.bool("add_generation_prompt", True)
    cont = f.bool("continue_final_message", False)
    if cont and f.has("add_generation_prompt") and add_gen:
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true")
    prefill = ""
    if messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        prefill, messages, add_gen = messages[-1]["content"], messages[:-1], True
        if not messages:
            raise bad_request("'messages' holds only an assistant message; a prefill needs a turn before it")
    elif cont:
        raise bad_request("'continue_final_message' needs an assistant message at the end of 'messages'")
    tools, forced = _tools(f)
    kwargs = f.obj("chat_template_kwargs").body
    if bad := [k for k in kwargs if k in RESERVED]:
        raise bad_request(f"'chat_template_kwargs' may not set {', '.join(bad)}")
    opts = state.opts
    fmt = f.str("reasoning_format", getattr(opts, "reasoning_format", "auto"))
    if fmt not in REASONING_FORMATS:
        raise bad_request(f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}")
    off = getattr(opts, "reasoning", "auto") == "off" or kwargs.get("enable_thinking") is False
    extra = {**_context(tools), "enable_thinking": not off, **kwargs}
    tags = _tags_in(state.tokenizer.template.source)

    def work() -> tuple[str, list[int]]:  # a worker thread: rendering and tokenizing are the heavy part
        text = render(state.tokenizer, messages, add_gen, **extra)
        if off and add_gen:
            text = _close_thinking(text, tags)
        text += prefill
        return text, encode_chat(state, text) if encode else []

    size = sum(len(m["content"]) for m in messages) + len(json.dumps(tools) if tools else "")
    text, ids = await state.workers.run(work, size=size)
    out = ChatPrompt(text, ids, think=tags if fmt != "none" else None, tools=tools)
    if out.think:
        out.thinking_open = text.rfind(out.think[0]) > text.rfind(out.think[1])
    if forced:  # a block left open is closed first, so the call is read as the answer, not as reasoning
        out.grammar = _forced_call(f, forced, state.tokenizer.template.source,
                                   out.think[1] + "\n" if out.thinking_open else None)
    return out
