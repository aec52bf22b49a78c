"""Saved chats: Enter reopens one, d deletes it, Escape goes back."""

from __future__ import annotations

import time

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from studio.tui.conversations import Conversation, ConversationStore


def label(conv: Conversation) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.updated))
    turns = sum(1 for m in conv.messages if m["role"] == "user")
    return f"{when}  {conv.title}  ({turns} message{'s' if turns != 1 else ''}, {conv.model or '?'})"


class ConversationsScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Back"),
        Binding("d,delete", "delete", "Delete"),
    ]

    def __init__(self, store: ConversationStore) -> None:
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical(id="chats-box"):
            yield Static(f"Saved chats in {self.store.folder}", id="chats-title")
            yield OptionList(id="chats-list")
            yield Footer()

    def on_mount(self) -> None:
        self._fill()

    @work(thread=True, exclusive=True, group="chats-list")
    def _fill(self) -> None:
        # reads and parses every saved chat: off the event loop
        chats = self.store.list()
        self.app.call_from_thread(self._show, chats)

    def _show(self, chats: list[Conversation]) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        for conv in chats:
            options.add_option(Option(label(conv), id=conv.id))
        if chats:
            options.highlighted = 0
        else:
            options.add_option(Option("(no saved chats yet: they are saved after each reply)", disabled=True))
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return
        option = options.get_option_at_index(options.highlighted)
        if option.id is not None:
            self.store.delete(option.id)
            self.notify("chat deleted")
            self._fill()
