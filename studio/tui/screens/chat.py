"""Chat: a conversation with the loaded model, each reply streamed token by token from the engine."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import HorizontalGroup, VerticalScroll
from textual.widgets import Input, Label, Static

from studio.errors import StudioError
from studio.tui.chat_stream import ChatError, stream_chat
from studio.tui.messages import ChatDelta, ChatFinished
from studio.tui.screens.base import StudioScreen
from studio.tui.widgets.chat_message import ChatMessage

NO_MODEL = "No model is loaded: press F1 for Models, then Enter to load one."


def sampling(temperature: str, max_tokens: str, seed: str) -> tuple[dict[str, Any], str | None]:
    """Request fields from the option inputs, or the first problem with them."""
    body: dict[str, Any] = {}
    try:
        if temperature.strip():
            body["temperature"] = float(temperature)
            if not 0 <= body["temperature"] <= 5:
                return {}, "temperature must be between 0 and 5"
        if max_tokens.strip():
            body["max_tokens"] = int(max_tokens)
            if body["max_tokens"] < 1:
                return {}, "max tokens must be at least 1"
        if seed.strip():
            body["seed"] = int(seed)
    except ValueError as exc:
        return {}, f"options: {exc}"
    return body, None


class ChatScreen(StudioScreen):
    MODE = "chat"
    AUTO_FOCUS = "#prompt"
    BINDINGS = [
        Binding("escape", "stop_or_leave", "Stop / leave input"),
        Binding("ctrl+n", "new_chat", "New chat"),
    ]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="transcript"):
            yield Static("Type a message below and press Enter. Replies stream from the loaded model.",
                         id="chat-hint")
        with HorizontalGroup(id="chat-options"):
            yield Label("temperature")
            yield Input("", placeholder="engine default", id="opt-temperature", compact=True)
            yield Label("max tokens")
            yield Input("128", id="opt-max-tokens", compact=True)
            yield Label("seed")
            yield Input("", placeholder="random", id="opt-seed", compact=True)
        yield Input(placeholder="Message (Enter sends)", id="prompt")

    def on_mount(self) -> None:
        self.conversation: list[dict[str, str]] = []
        self._reply: ChatMessage | None = None
        self._pending: dict[str, str] | None = None
        self._turn = 0  # late messages from a stopped reply must not land in the next one

    def on_screen_resume(self) -> None:
        # Coming to Chat means coming to type, whatever had focus when the user left.
        self.query_one("#prompt", Input).focus()

    @property
    def streaming(self) -> bool:
        return self._reply is not None

    # sending -------------------------------------------------------------------------------------

    @on(Input.Submitted, "#prompt")
    def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.streaming:
            self.notify("a reply is still streaming: Escape stops it", severity="warning")
            return
        body, problem = sampling(self.query_one("#opt-temperature", Input).value,
                                 self.query_one("#opt-max-tokens", Input).value,
                                 self.query_one("#opt-seed", Input).value)
        transcript = self.query_one("#transcript")
        transcript.mount(ChatMessage("user", text))
        event.input.clear()
        if problem:
            self._error(problem)
            return
        self._pending = {"role": "user", "content": text}
        self._reply = ChatMessage("assistant", title=self.studio.status.get("model") or "assistant")
        transcript.mount(self._reply)
        transcript.scroll_end(animate=False)
        self._turn += 1
        self.stream_reply(self._turn, [*self.conversation, self._pending], body)

    @work(exclusive=True, group="chat")
    async def stream_reply(self, turn: int, messages: list[dict[str, str]], options: dict[str, Any]) -> None:
        manager = self.studio.manager
        start = time.monotonic()
        pieces, seed, finish = 0, None, None
        try:
            if manager.loaded is None and manager.state != "loading":
                raise ChatError(NO_MODEL)
            child = await manager.engine()  # respawns once if the engine died since the last request
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as session:
                async for piece in stream_chat(session, child.base_url, {"messages": messages, **options},
                                               headers=child.auth_headers):
                    seed = piece.seed if piece.seed is not None else seed
                    finish = piece.finish_reason or finish
                    if piece.text:
                        pieces += 1
                        self.post_message(ChatDelta(turn, piece.text))
        except (ChatError, StudioError) as exc:
            self.post_message(ChatFinished(turn, error=str(exc.message if isinstance(exc, StudioError) else exc)))
        except asyncio.CancelledError:
            self.post_message(ChatFinished(turn, finish_reason="stopped", pieces=pieces, seed=seed,
                                           seconds=time.monotonic() - start))
            raise
        except Exception as exc:
            self.post_message(ChatFinished(turn, error=f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(ChatFinished(turn, seed=seed, finish_reason=finish, pieces=pieces,
                                           seconds=time.monotonic() - start))

    def on_chat_delta(self, message: ChatDelta) -> None:
        if self._reply is not None and message.turn == self._turn:
            self._reply.append(message.text)
            self.query_one("#transcript").scroll_end(animate=False)

    def on_chat_finished(self, message: ChatFinished) -> None:
        if message.turn != self._turn or self._reply is None:
            return
        reply, self._reply = self._reply, None
        if message.error:
            reply.remove()
            self._error(message.error)
            self._pending = None  # the turn failed: it is not part of the conversation
            return
        parts = [f"{message.pieces} pieces", f"{message.seconds:.1f} s"]
        if message.seed is not None:
            parts.append(f"seed {message.seed}")
        if message.finish_reason:
            parts.append(message.finish_reason)
        reply.finish(" · ".join(parts))
        if self._pending is not None:
            self.conversation += [self._pending, {"role": "assistant", "content": reply.text}]
            self._pending = None

    def _error(self, text: str) -> None:
        transcript = self.query_one("#transcript")
        transcript.mount(ChatMessage("error", text))
        transcript.scroll_end(animate=False)

    # keys ----------------------------------------------------------------------------------------

    def action_stop_or_leave(self) -> None:
        if self.streaming:
            self.workers.cancel_group(self, "chat")
        else:
            self.set_focus(None)  # number keys switch screens again

    def action_new_chat(self) -> None:
        if self.streaming:
            self.workers.cancel_group(self, "chat")
        self._reply = None
        self._turn += 1
        self.conversation = []
        self._pending = None
        self.query_one("#transcript").remove_children(ChatMessage)
        self.query_one("#prompt", Input).focus()
