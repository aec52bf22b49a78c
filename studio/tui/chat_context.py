"""Keeping a conversation inside the loaded engine's context: the oldest turns go first, the system prompt
and the newest message stay (as LM Studio's "truncate middle" does), and the chat says how many went.

Prompt sizes come from the engine itself (/apply-template, then /tokenize), so the count is the one the
engine will use, chat template included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

# Room kept for the reply when the user sets no limit: a quarter of the context, at most this.
REPLY_ROOM = 512


@dataclass
class Fitted:
    messages: list[dict[str, str]]
    dropped: int  # messages left out, oldest first
    prompt_tokens: int
    context: int  # the positions one sequence may use


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    async with session.post(url, json=body, headers=headers) as resp:
        resp.raise_for_status()
        return await resp.json()


async def slot_context(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> int:
    async with session.get(base_url + "/props", headers=headers) as resp:
        resp.raise_for_status()
        props = await resp.json()
    return int(props.get("n_ctx_seq") or props.get("n_ctx") or 0)


async def prompt_tokens(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str],
                        messages: list[dict[str, str]]) -> int:
    prompt = (await _post(session, base_url + "/apply-template", {"messages": messages}, headers))["prompt"]
    ids = (await _post(session, base_url + "/tokenize", {"content": prompt, "add_special": True}, headers))
    return len(ids["tokens"])


def reply_room(context: int, max_tokens: int | None) -> int:
    return max_tokens if max_tokens else min(REPLY_ROOM, max(1, context // 4))


async def fit(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str],
              messages: list[dict[str, str]], max_tokens: int | None) -> Fitted:
    """`messages`: an optional system message, then turns ending with the new user message."""
    context = await slot_context(session, base_url, headers)
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(head):]
    room = reply_room(context, max_tokens)
    dropped = 0
    while True:
        kept = head + turns[dropped:]
        used = await prompt_tokens(session, base_url, headers, kept)
        # Drop a user turn with its reply; the newest message always stays (the engine refuses it if too big).
        if used + room <= context or len(turns) - dropped <= 1 or context <= 0:
            return Fitted(kept, dropped, used, context)
        dropped += 2 if len(turns) - dropped > 2 else 1
