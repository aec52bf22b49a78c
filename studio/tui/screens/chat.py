"""Chat: a conversation with the loaded model, each reply streamed token by token from the engine.

Conversations are saved after every reply beside the settings (ctrl+o lists them); the system prompt
sits above the transcript; `/export [path]` writes the conversation as Markdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.containers import HorizontalGroup, VerticalScroll
from textual.widgets import Input, Label, Static

from studio.tui.chat_turn import speed_text, stream_turn
from studio.tui.conversations import Conversation, ConversationStore
from studio.tui.messages import ChatDelta, ChatFinished, ChatTrimmed, EngineReloaded
from studio.tui.screens.base import StudioScreen, keys
from studio.tui.screens.conversations import ConversationsScreen
from studio.tui.widgets.chat_message import ChatMessage

HINT = ("Type a message below and press Enter. Replies stream from the loaded model. "
        "ctrl+r regenerates, ctrl+y copies the last reply, ctrl+o opens saved chats, /export [file] "
        "writes Markdown.")


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


class ChatScreen(StudioScreen, mode="chat", focus="#prompt"):
    BINDINGS = keys(("escape", "stop_or_leave", "Stop / leave input"), ("ctrl+n", "new_chat", "New chat"),
                    ("ctrl+r", "regenerate", "Regenerate"), ("ctrl+y", "copy_reply", "Copy reply"),
                    ("ctrl+o", "open_chats", "Chats…"))

    def compose_body(self) -> ComposeResult:
        with HorizontalGroup(id="system-row"):
            yield Label("System prompt")
            yield Input(placeholder="optional: how the model should behave", id="system", compact=True)
        with VerticalScroll(id="transcript"):
            yield Static(HINT, id="chat-hint", markup=False)
        yield Static("", id="chat-live")
        with HorizontalGroup(id="chat-options"):
            yield Label("temperature")
            yield Input("", placeholder="engine default", id="opt-temperature", compact=True)
            yield Label("max tokens")
            yield Input("", placeholder="to context end", id="opt-max-tokens", compact=True)
            yield Label("seed")
            yield Input("", placeholder="random", id="opt-seed", compact=True)
        yield Input(placeholder="Message (Enter sends)", id="prompt")

    def on_mount(self) -> None:
        self.store = ConversationStore(self.studio.conversations_dir)
        self.chat = Conversation()
        self._reply: ChatMessage | None = None
        self._pending: dict[str, str] | None = None
        self._failed: dict[str, str] | None = None
        self._turn = 0  # late messages from a stopped reply must not land in the next one

    def on_screen_resume(self) -> None:
        # Coming to Chat means coming to type, whatever had focus when the user left.
        self.query_one("#prompt", Input).focus()

    @property
    def conversation(self) -> list[dict[str, str]]:
        return self.chat.messages

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
        event.input.clear()
        if text.startswith("/export"):
            self._export(text[len("/export"):].strip())
            return
        self.query_one("#transcript").mount(ChatMessage("user", text))
        self._ask({"role": "user", "content": text})

    def _ask(self, user: dict[str, str]) -> None:
        body, problem = sampling(self.query_one("#opt-temperature", Input).value,
                                 self.query_one("#opt-max-tokens", Input).value,
                                 self.query_one("#opt-seed", Input).value)
        if problem:
            self._note("error", problem)
            return
        self.chat.system = self.query_one("#system", Input).value
        self._pending, self._failed = user, None
        self._reply = ChatMessage("assistant", title=self.studio.status.get("model") or "assistant")
        transcript = self.query_one("#transcript")
        transcript.mount(self._reply)
        transcript.scroll_end(animate=False)
        self._turn += 1
        system = [{"role": "system", "content": self.chat.system}] if self.chat.system.strip() else []
        self.query_one("#chat-live", Static).update("waiting for the first token…")
        self.stream_reply(self._turn, [*system, *self.chat.messages, user], body)

    @work(exclusive=True, group="chat")
    async def stream_reply(self, turn: int, messages: list[dict[str, str]], options: dict[str, Any]) -> None:
        await stream_turn(self.studio.manager, turn, messages, options, self.post_message)

    def on_chat_trimmed(self, message: ChatTrimmed) -> None:
        if message.turn == self._turn and self._reply is not None:
            note = ChatMessage("note", f"The conversation outgrew the context ({message.context} tokens): the "
                                       f"oldest {message.dropped} messages are left out of this request; the "
                                       "system prompt is kept.")
            self.query_one("#transcript").mount(note, before=self._reply)

    def on_chat_delta(self, message: ChatDelta) -> None:
        if self._reply is not None and message.turn == self._turn:
            self._reply.append(message.text)
            self.query_one("#chat-live", Static).update(
                "streaming: " + speed_text(message.tokens, message.seconds, message.ttft))
            self.query_one("#transcript").scroll_end(animate=False)

    def on_chat_finished(self, message: ChatFinished) -> None:
        if message.turn != self._turn or self._reply is None:
            return
        reply, self._reply = self._reply, None
        self.query_one("#chat-live", Static).update("")
        if message.error:
            reply.remove()
            self._note("error", message.error)
            # The turn failed: it is not part of the conversation, but ctrl+r can send it again.
            self._failed, self._pending = self._pending, None
            return
        parts = [speed_text(message.tokens, message.seconds, message.ttft)]
        if message.seed is not None:
            parts.append(f"seed {message.seed}")
        if message.finish_reason:
            parts.append(message.finish_reason)
        reply.finish(" · ".join(parts))
        if self._pending is not None:
            self.chat.messages += [self._pending, {"role": "assistant", "content": reply.text}]
            self.chat.model = self.studio.status.get("model") or self.chat.model
            self._pending = None
            self.save_chat(self.chat)

    def on_engine_reloaded(self, message: EngineReloaded) -> None:
        if message.error:
            self._note("error", f"the engine could not be reloaded: {message.error}")
        else:
            self._note("note", "The engine is running again: ctrl+r sends your last message again.")
        self.studio.poll_status()

    def _note(self, role: str, text: str) -> None:
        transcript = self.query_one("#transcript")
        transcript.mount(ChatMessage(role, text))
        transcript.scroll_end(animate=False)

    # saving --------------------------------------------------------------------------------------

    @work(thread=True, group="chat-save")
    def save_chat(self, chat: Conversation) -> None:
        try:
            self.store.save(chat)
        except OSError as exc:
            self.app.call_from_thread(self.notify, f"the chat was not saved: {exc}", severity="error")

    def _export(self, where: str) -> None:
        if not self.chat.messages:
            self.notify("nothing to export yet", severity="warning")
            return
        try:
            path = self.store.export(self.chat, Path(where) if where else None)
        except OSError as exc:
            self._note("error", f"/export failed: {exc}")
            return
        self._note("note", f"Exported to {path}")

    def show_conversation(self, chat: Conversation) -> None:
        self.action_new_chat()
        self.chat = chat
        self.query_one("#system", Input).value = chat.system
        transcript = self.query_one("#transcript")
        for m in chat.messages:
            transcript.mount(ChatMessage(m["role"], m["content"],
                                         title=chat.model if m["role"] == "assistant" else None))
        transcript.scroll_end(animate=False)

    # keys ----------------------------------------------------------------------------------------

    def action_stop_or_leave(self) -> None:
        if self.streaming:
            self.workers.cancel_group(self, "chat")
        else:
            self.set_focus(None)  # single-letter keys act again

    def action_new_chat(self) -> None:
        if self.streaming:
            self.workers.cancel_group(self, "chat")
        self._reply = None
        self._turn += 1
        self.chat = Conversation(system=self.query_one("#system", Input).value)
        self._pending = self._failed = None
        self.query_one("#transcript").remove_children(ChatMessage)
        self.query_one("#chat-live", Static).update("")
        self.query_one("#prompt", Input).focus()

    def action_regenerate(self) -> None:
        if self.streaming:
            self.notify("a reply is still streaming: Escape stops it", severity="warning")
            return
        if self._failed is not None:
            self._ask(self._failed)
            return
        messages = self.chat.messages
        if messages and messages[-1]["role"] == "assistant":
            messages.pop()
            replies = self.query(".-assistant")
            if replies:
                replies.last().remove()
        if not messages or messages[-1]["role"] != "user":
            self.notify("nothing to regenerate yet", severity="warning")
            return
        self._ask(messages.pop())

    def action_copy_reply(self) -> None:
        reply = next((m["content"] for m in reversed(self.chat.messages) if m["role"] == "assistant"), None)
        if reply is None:
            self.notify("no reply to copy yet", severity="warning")
            return
        self.app.copy_to_clipboard(reply)  # OSC 52: the terminal puts it on the clipboard
        self.notify(f"copied the last reply ({len(reply)} characters)")

    def action_open_chats(self) -> None:
        def opened(conv_id: str | None) -> None:
            if conv_id is not None:
                try:
                    self.show_conversation(self.store.load(conv_id))
                except (OSError, ValueError) as exc:
                    self.notify(f"cannot open that chat: {exc}", severity="error")

        self.app.push_screen(ConversationsScreen(self.store), opened)
