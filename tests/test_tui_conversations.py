"""Saved chats: the store beside the settings, and reopening / deleting them from the Chat screen."""

from __future__ import annotations

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


async def test_a_saved_chat_reopens_and_deletes_from_the_chat_screen(tmp_path):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([], include_bundled=False), env={},
                          logs=tmp_path / "logs")
    app = LockstepApp(manager, api=False)
    store = ConversationStore(app.conversations_dir)
    assert app.conversations_dir == tmp_path / "config" / "conversations"  # beside settings.json
    saved = chat("how do I sort a list?", 0)
    store.save(saved)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4", "ctrl+o")
        assert isinstance(app.screen, ConversationsScreen)
        await pilot.press("enter")
        screen = app.screen
        assert screen.chat.id == saved.id and screen.query_one("#system").value == "Be brief."
        assert [m.text for m in screen.query(ChatMessage)] == ["how do I sort a list?", "ok"]
        await pilot.press("ctrl+o", "d")
        await pilot.pause()
        assert store.list() == []
