"""Streaming a chat reply from the engine's /v1/chat/completions (OpenAI-style server-sent events)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

# A reply may hold any token, and a raw control character would drive the terminal itself.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"} | {0x7F: 0x2421}
_C1 = {c: 0xFFFD for c in range(0x80, 0xA0)}
_VISIBLE = str.maketrans({**_CONTROL_PICTURES, **_C1})


def printable(text: str) -> str:
    return text.translate(_VISIBLE)


class ChatError(Exception):
    """The engine refused the request or the stream broke; the message says which."""


@dataclass
class Piece:
    text: str
    seed: int | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None  # the closing chunk's token counts


def _error_text(body: Any, status: int) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return f"{err.get('message', 'error')} (HTTP {status}, {err.get('type', 'error')})"
    return f"HTTP {status}: {str(body)[:300]}"


async def stream_chat(session: aiohttp.ClientSession, base_url: str, body: dict[str, Any],
                      headers: dict[str, str] | None = None) -> AsyncIterator[Piece]:
    """Yield the reply's text pieces as the engine sends them."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with session.post(base_url + "/v1/chat/completions", json=payload, headers=headers) as resp:
            if resp.status != 200:
                raw = await resp.text()
                try:
                    parsed: Any = json.loads(raw)
                except ValueError:
                    parsed = raw
                raise ChatError(_error_text(parsed, resp.status))
            async for raw_line in resp.content:
                line = raw_line.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise ChatError(f"the engine sent an unreadable event: {data[:120]!r}") from exc
                if "error" in chunk:
                    raise ChatError(_error_text(chunk, 500))
                if chunk.get("usage"):
                    yield Piece("", chunk.get("seed"), usage=chunk["usage"])
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    yield Piece(delta.get("content") or "", chunk.get("seed"), choice.get("finish_reason"))
    except aiohttp.ClientError as exc:
        raise ChatError(f"the engine stopped answering: {exc}") from exc
