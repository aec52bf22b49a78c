"""One chat reply from the loaded engine, posted to the Chat screen as messages: fit the conversation to
the context, stream the reply with live speed figures, and tell a dead engine from a refused request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from textual.message import Message

from studio.errors import StudioError
from studio.manager import LoadManager, exit_text
from studio.tui.chat_context import fit
from studio.tui.chat_stream import ChatError, stream_chat
from studio.tui.messages import ChatDelta, ChatFinished, ChatTrimmed, EngineReloaded

NO_MODEL = "No model is loaded: press F1 for Models, then Enter to load one."
# How long a broken stream waits for the engine's exit status before calling it a refusal.
EXIT_WAIT_S = 2.0


async def stream_turn(manager: LoadManager, turn: int, messages: list[dict[str, str]], options: dict[str, Any],
                      post: Callable[[Message], Any]) -> None:
    start = time.monotonic()
    tokens, seed, finish, ttft, usage = 0, None, None, None, None
    child = None
    try:
        if manager.loaded is None and manager.state != "loading":
            raise ChatError(NO_MODEL)
        child = await manager.engine()  # respawns once if the engine died since the last request
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as session:
            fitted = await fit(session, child.base_url, child.auth_headers, messages, options.get("max_tokens"))
            if fitted.dropped:
                post(ChatTrimmed(turn, fitted.dropped, fitted.context))
            body = {"messages": fitted.messages, **options}
            if "max_tokens" not in options and fitted.context > 0:
                body["max_tokens"] = max(1, fitted.context - fitted.prompt_tokens)  # up to the context's end
            async for piece in stream_chat(session, child.base_url, body, headers=child.auth_headers):
                seed = piece.seed if piece.seed is not None else seed
                finish = piece.finish_reason or finish
                usage = piece.usage or usage
                if piece.text:
                    tokens += 1
                    now = time.monotonic() - start
                    ttft = now if ttft is None else ttft
                    post(ChatDelta(turn, piece.text, tokens, ttft, now))
    except (ChatError, StudioError, aiohttp.ClientError) as exc:
        text = exc.message if isinstance(exc, StudioError) else str(exc)
        code = await _exit_code(child)
        if code is not None:
            post(ChatFinished(turn, error=f"the engine stopped ({exit_text(code)}); reloading…",
                              engine_stopped=True))
            await _reload(manager, post)
        else:
            post(ChatFinished(turn, error=text))
    except asyncio.CancelledError:
        post(ChatFinished(turn, finish_reason="stopped", tokens=tokens, seed=seed, ttft=ttft,
                          seconds=time.monotonic() - start))
        raise
    except Exception as exc:
        post(ChatFinished(turn, error=f"{type(exc).__name__}: {exc}"))
    else:
        if usage and usage.get("completion_tokens") is not None:
            tokens = int(usage["completion_tokens"])
        post(ChatFinished(turn, seed=seed, finish_reason=finish, tokens=tokens, ttft=ttft,
                          seconds=time.monotonic() - start))


async def _exit_code(child) -> int | None:
    if child is None:
        return None
    with contextlib.suppress(TimeoutError):
        return await asyncio.wait_for(child.process.wait(), EXIT_WAIT_S)
    return None


async def _reload(manager: LoadManager, post: Callable[[Message], Any]) -> None:
    try:
        await manager.engine()  # the one automatic respawn
    except StudioError as exc:
        post(EngineReloaded(exc.message))
    except Exception as exc:
        post(EngineReloaded(f"{type(exc).__name__}: {exc}"))
    else:
        post(EngineReloaded())


def speed_text(tokens: int, seconds: float, ttft: float | None) -> str:
    """"42 tokens · 38.1 tokens/s · first token 0.12 s": the rate counts from the first token."""
    parts = [f"{tokens} token{'s' if tokens != 1 else ''}"]
    if ttft is not None and tokens > 1 and seconds > ttft:
        parts.append(f"{(tokens - 1) / (seconds - ttft):.1f} tokens/s")
    if ttft is not None:
        parts.append(f"first token {ttft:.2f} s")
    return " · ".join(parts)
