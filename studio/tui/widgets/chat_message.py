"""One turn of the conversation in the transcript; the assistant's grows as tokens stream in."""

from __future__ import annotations

from textual.widgets import Static

from studio.tui.chat_stream import printable


class ChatMessage(Static):
    def __init__(self, role: str, text: str = "", title: str | None = None) -> None:
        super().__init__(printable(text), markup=False, classes=f"chat-message -{role}")
        self.role = role
        self.text = text
        self.border_title = title or {"user": "you", "assistant": "assistant", "error": "error",
                                              "note": "note"}.get(role, role)

    def append(self, text: str) -> None:
        self.text += text
        self.update(printable(self.text))

    def finish(self, note: str) -> None:
        self.border_subtitle = note
        if not self.text:
            self.update("(empty reply)")
