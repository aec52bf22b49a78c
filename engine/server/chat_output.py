"""A chat answer's text -> OpenAI's message parts: reasoning_content (a `<think>` block), content and tool_calls.

Tool calls are recognised in the common formats: Hermes/Qwen `<tool_call>{json}</tool_call>`, Mistral
`[TOOL_CALLS][{...}]` (and `[TOOL_CALLS]name[ARGS]{...}`), and Llama 3.x's bare JSON object
(`{"name": ..., "parameters": ...}`, after `<|python_tag|>` or not). Only a call to a declared tool counts,
so an answer that merely shows JSON stays content.
"""

from __future__ import annotations

import json
import re
import secrets

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.\-]+)\s*\[ARGS\]", re.DOTALL)


class ReasoningSplitter:
    """Feeds text in pieces and returns (reasoning, content) pieces; a piece that may be the start of a tag
    is held back until the next one decides it."""

    def __init__(self, tags: tuple[str, str] | None, starts_open: bool):
        self.tags = tags
        self.mode = "content" if tags is None else ("reasoning" if starts_open else "start")
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.mode == "start":
                open_ = self.tags[0]
                head = self.buf.lstrip()
                if head.startswith(open_):
                    self.buf, self.mode = head[len(open_):], "reasoning"
                    continue
                if open_.startswith(head) and not final:
                    return reasoning, content  # undecided: may still become the open tag
                self.mode = "content"
            if self.mode == "reasoning":
                close = self.tags[1]
                end = self.buf.find(close)
                if end >= 0:
                    reasoning += self.buf[:end]
                    self.buf, self.mode = self.buf[end + len(close):].lstrip(), "content"
                    continue
                keep = 0 if final else _partial_suffix(self.buf, close)
                reasoning += self.buf[: len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content
            content += self.buf
            self.buf = ""
            return reasoning, content


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _call(name: str, args) -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _from_obj(obj, names: set[str]) -> dict | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return _call(obj["name"], args)


def _json_prefix(text: str):
    """The JSON value at the start of text and where it ends, or (None, 0)."""
    try:
        return json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None, 0


def parse_tool_calls(text: str, tools: list | None) -> tuple[str | None, list[dict]]:
    """(content without the calls, or None when nothing else was said; the calls)."""
    if not tools:
        return text, []
    names = {t["function"]["name"] for t in tools}
    calls = []
    for m in _HERMES.finditer(text):
        obj, _ = _json_prefix(m.group(1))
        if (c := _from_obj(obj, names)) is not None:
            calls.append(c)
    if calls:
        rest = _HERMES.sub("", text).strip()
        return rest or None, calls
    if "[TOOL_CALLS]" in text:
        head, _, tail = text.partition("[TOOL_CALLS]")
        named = _MISTRAL_NAMED.search("[TOOL_CALLS]" + tail)
        if named and named.group(1) in names:
            args, _ = _json_prefix(tail[named.end() - len("[TOOL_CALLS]"):].lstrip())
            calls.append(_call(named.group(1), args))
        else:
            arr, _ = _json_prefix(tail.lstrip())
            for obj in arr if isinstance(arr, list) else [arr]:
                if (c := _from_obj(obj, names)) is not None:
                    calls.append(c)
        if calls:
            return head.strip() or None, calls
    body = text.strip().removeprefix("<|python_tag|>").strip()
    pos = 0
    while pos < len(body):
        obj, end = _json_prefix(body[pos:])
        if (c := _from_obj(obj, names)) is None:
            break
        calls.append(c)
        pos += end
        while pos < len(body) and body[pos] in "; \n\t":
            pos += 1
    if calls and pos >= len(body):
        return None, calls
    return text, []
