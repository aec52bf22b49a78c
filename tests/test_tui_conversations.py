"""Saved chats: the store beside the settings, and reopening / deleting them from the Chat screen."""

from __future__ import annotations

import threading
import time

from textual.widgets import OptionList

from settings import SettingsStore
from studio.catalog import Catalog
from studio.manager import LoadManager
from studio.tui.app import LockstepApp
from studio.tui.conversations import Conversation, ConversationStore, to_markdown
from studio.tui.screens.conversations import ConversationsScreen
from studio.tui.widgets.chat_message import ChatMessage

SIZE = (120, 40)


def chat(text: str, updated: float) -> Conversation:
    conv = Conversation(system="Be brief.", model="tiny",
                        messages=[{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}])
    conv.updated = updated
    return conv


def test_saved_chats_list_newest_first_and_skip_a_damaged_file(tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    old, new = chat("first question", 1.0), chat("second question", 2.0)
    store.save(old)
    store.save(new)  # updated is stamped at save: the second is newer
    (store.folder / ("0" * 32 + ".json")).write_text("{not json")
    assert [c.title for c in store.list()] == ["second question", "first question"]
    assert (store.folder / ("0" * 32 + ".json")).exists()  # kept, never deleted
    store.delete(old.id)
    assert [c.id for c in store.list()] == [new.id]
    assert store.load(new.id).messages == new.messages


def test_markdown_export_has_the_system_prompt_and_every_turn(tmp_path):
    text = to_markdown(chat("why?", 0))
    assert "## System\n\nBe brief." in text and "## You\n\nwhy?" in text and "## Assistant\n\nok" in text


async def listed(pilot, screen, conv_id, deadline_s=120):
    """Until the Chats list shows `conv_id` (it is read in a worker)."""
    options = screen.query_one(OptionList)
    deadline = time.monotonic() + deadline_s
    while not any(options.get_option_at_index(i).id == conv_id for i in range(options.option_count)):
        assert time.monotonic() < deadline, "the saved chats were never listed"
        await pilot.pause(0.05)


async def test_a_saved_chat_reopens_and_deletes_from_the_chat_screen(tmp_path, monkeypatch):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([], include_bundled=False), env={},
                          logs=tmp_path / "logs")
    app = LockstepApp(manager, api=False)
    store = ConversationStore(app.conversations_dir)
    assert app.conversations_dir == tmp_path / "config" / "conversations"  # beside settings.json
    saved = chat("how do I sort a list?", 0)
    store.save(saved)
    listed_on = []
    real_list = ConversationStore.list
    monkeypatch.setattr(ConversationStore, "list",
                        lambda self: (listed_on.append(threading.get_ident()), real_list(self))[1])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4", "ctrl+o")
        assert isinstance(app.screen, ConversationsScreen)
        await listed(pilot, app.screen, saved.id)
        assert listed_on and threading.get_ident() not in listed_on  # every chat file is read off the event loop
        await pilot.press("enter")
        screen = app.screen
        assert screen.chat.id == saved.id and screen.query_one("#system").value == "Be brief."
        assert [m.text for m in screen.query(ChatMessage)] == ["how do I sort a list?", "ok"]
        await pilot.press("ctrl+o")
        await listed(pilot, app.screen, saved.id)
        await pilot.press("d")
        await pilot.pause()
        assert store.list() == []
