"""OpenAI chat messages -> the model's chat template -> prompt text and tokens."""

from __future__ import annotations

import json
from typing import Any

from engine.chat_template import ChatTemplateError
from engine.server.errors import bad_request
from engine.server.params import check_fits, kind_of
from engine.server.state import EngineState

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_MESSAGES = 4096


def _content(i: int, msg: dict) -> str:
    content = msg.get("content")
    if content is None:
        if msg["role"] == "assistant":  # an assistant turn that only carried tool calls
            return ""
        raise bad_request(f"'messages[{i}].content' is required for role {msg['role']!r}")
    return text_of_parts(content, f"messages[{i}].content", ("text",))


def text_of_parts(content: Any, where: str, text_types: tuple[str, ...]) -> str:
    """A message's content: a string, or an array of text parts joined as llama-server joins them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or an array of parts, not {kind_of(content)}")
    texts = []
    for j, part in enumerate(content):
        at = f"'{where}[{j}]'"
        if not isinstance(part, dict):
            raise bad_request(f"{at} must be an object, not {kind_of(part)}")
        kind = part.get("type")
        if kind not in text_types:
            raise bad_request(f"{at}: content type {kind!r} is not supported (text only)")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{at}.text must be a string")
        texts.append(part["text"])
    return "\n\n".join(texts)


def check_messages(value: Any) -> list[dict]:
    """Messages with text content, as the template expects them (content always a string)."""
    if value is None:
        raise bad_request("'messages' is required")
    if not isinstance(value, list):
        raise bad_request(f"'messages' must be an array, not {kind_of(value)}")
    if not value:
        raise bad_request("'messages' is empty")
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"'messages' has {len(value)} entries; at most {MAX_MESSAGES}")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise bad_request(f"'messages[{i}]' must be an object, not {kind_of(msg)}")
        role = msg.get("role")
        if not isinstance(role, str):
            raise bad_request(f"'messages[{i}].role' must be a string")
        if role not in ROLES:
            raise bad_request(f"'messages[{i}].role' {role!r} is not one of {', '.join(ROLES)}")
        name = msg.get("name")
        if name is not None and not isinstance(name, str):
            raise bad_request(f"'messages[{i}].name' must be a string")
        clean = {"role": role, "content": _content(i, msg)}
        if name is not None:
            clean["name"] = name
        for key, kind in (("tool_calls", list), ("tool_call_id", str), ("reasoning_content", str)):
            if msg.get(key) is not None:  # what templates read of tool turns, passed on as given
                if not isinstance(msg[key], kind):
                    raise bad_request(f"'messages[{i}].{key}' must be {'an array' if kind is list else 'a string'}")
                clean[key] = _tool_calls(i, msg[key]) if key == "tool_calls" else msg[key]
        out.append(clean)
    if len(out) >= 2 and out[-1]["role"] == out[-2]["role"] == "assistant":
        raise bad_request("'messages' ends with two assistant messages; at most one (the prefill) may end it")
    return out


def _tool_calls(i: int, calls: list) -> list:
    """Templates iterate arguments as a mapping; OpenAI clients send them as a JSON string."""
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"'messages[{i}].tool_calls[{j}]' must be an object with function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise bad_request(f"'messages[{i}].tool_calls[{j}].function.arguments' is not valid JSON") from None
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
    """On a worker thread (EngineState.workers): templates are foreign code with a loop budget."""
    try:
        return tokenizer.apply_chat(messages, add_generation_prompt, **extra)
    except ChatTemplateError as e:  # the message names the template and what it did
        raise bad_request(str(e)) from None


def encode_chat(state: EngineState, text: str) -> list[int]:  # worker thread
    tokenizer = state.tokenizer
    check_fits(state, text, "chat prompt")
    # A template that writes the BOS token itself must not get a second one from the tokenizer.
    with_bos = not (tokenizer.bos_token and text.startswith(tokenizer.bos_token))
    ids = tokenizer.encode(text, add_special=with_bos)
    if not ids:
        raise bad_request("the chat template rendered an empty prompt")
    return ids
