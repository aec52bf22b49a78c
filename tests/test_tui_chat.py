"""The Chat screen with the real engine child on the CPU backend, driven by Pilot: the context a TUI load
gets, trimming a conversation that outgrew it, the system prompt, live speed, regenerate, copy, export,
saved chats, a SIGKILLed engine mid-reply, and quitting with a model loaded.
"""

from __future__ import annotations

import json
import os
import signal

from studio.tui import chat_turn
from studio.tui.app import LockstepApp
from studio.tui.screens.quit import QuitScreen
from studio.tui.widgets.chat_message import ChatMessage
from tests.test_tui_pilot import CHAT_S, LOAD_S, SIZE, load_from_models, pick_model, studio_env, until  # noqa: F401

LONG = "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)  # " * 7


async def chat_turn_done(pilot, screen, n_messages: int, what: str) -> None:
    await until(pilot, lambda: not screen.streaming and len(screen.conversation) == n_messages, CHAT_S, what)


async def start_a_reply(app, pilot, max_tokens: int):
    """On the Chat screen, send a message and return once the reply has started streaming."""
    await pilot.press("f4")
    screen = app.screen
    screen.query_one("#opt-max-tokens").value = str(max_tokens)
    await pilot.press(*"hello", "enter")
    await until(pilot, lambda: screen.streaming and bool(screen.query(".-assistant").last(ChatMessage).text),
                CHAT_S, "the reply to start streaming")
    return screen


async def test_a_tui_load_gets_one_slot_with_the_native_context(studio_env):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await load_from_models(pilot, studio_env)
        argv = app.status["argv"]
        native = next(m.native_context for m in app.models if m.id == studio_env)
        assert argv[argv.index("--parallel") + 1] == "1"
        assert argv[argv.index("--ctx-size") + 1] == str(native)


async def test_a_long_chat_drops_its_oldest_turns_and_keeps_the_system_prompt(studio_env, monkeypatch, tmp_path):  # noqa: F811
    sent: list[list[dict]] = []
    real_stream = chat_turn.stream_chat

    def spy(session, base_url, body, headers=None):
        sent.append(body["messages"])
        return real_stream(session, base_url, body, headers=headers)

    monkeypatch.setattr(chat_turn, "stream_chat", spy)
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await pick_model(pilot, studio_env)
        await pilot.press("f2")
        form = app.screen
        form.query_one("#field-ctx_size").value = "512"
        await pilot.pause()
        await pilot.press("ctrl+l")
        await until(pilot, lambda: app.status.get("state") == "ready", LOAD_S, "the 512-token load")
        await pilot.press("f4")
        screen = app.screen
        screen.query_one("#system").value = "You are terse."
        screen.query_one("#opt-max-tokens").value = "8"
        screen.query_one("#opt-seed").value = "7"
        for turn in range(1, 4):
            screen.query_one("#prompt").value = f"{turn} {LONG}"
            await pilot.press("enter")
            await chat_turn_done(pilot, screen, 2 * turn, f"reply {turn}")
        assert not screen.query(".-error"), [m.text for m in screen.query(".-error")]
        notes = [m.text for m in screen.query(".-note").results(ChatMessage)]
        assert any("outgrew the context (512 tokens)" in n and "system prompt is kept" in n for n in notes), notes
        assert all(msgs[0] == {"role": "system", "content": "You are terse."} for msgs in sent)
        assert len(sent[-1]) < 1 + 5  # system + every earlier turn + the new message would be 6
        assert sent[-1][-1]["content"].startswith("3 ")

        reply = screen.query(".-assistant").last(ChatMessage)
        assert "tokens/s" in reply.border_subtitle and "first token" in reply.border_subtitle
        assert "pieces" not in reply.border_subtitle

        await pilot.press("ctrl+y")
        assert app.clipboard == screen.conversation[-1]["content"]

        await pilot.press("ctrl+r")
        await chat_turn_done(pilot, screen, 6, "the regenerated reply")
        assert len(screen.query(".-assistant")) == 3  # replaced, not added

        target = tmp_path / "chat.md"
        screen.query_one("#prompt").value = f"/export {target}"
        await pilot.press("enter")
        await until(pilot, target.exists, 10, "the Markdown export")
        text = target.read_text()
        assert "## System" in text and "You are terse." in text and text.count("## You") == 3

        saved = list((tmp_path / "config" / "conversations").glob("*.json"))
        assert len(saved) == 1 and json.loads(saved[0].read_text())["system"] == "You are terse."


async def test_a_killed_engine_mid_reply_says_so_and_reloads(studio_env, tiny_llama_noeos):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        # Without an end token the reply runs until it is killed (random weights end some replies at once).
        await load_from_models(pilot, tiny_llama_noeos.name)
        first_pid = app.status["pid"]
        screen = await start_a_reply(app, pilot, max_tokens=4000)
        os.kill(first_pid, signal.SIGKILL)
        await until(pilot, lambda: bool(screen.query(".-error")), CHAT_S, "the crash message")
        error = screen.query(".-error").last(ChatMessage).text
        assert error == "the engine stopped (killed by SIGKILL); reloading…", error
        await until(pilot, lambda: any("running again" in m.text for m in screen.query(".-note").results(ChatMessage)),
                    LOAD_S, "the reload")
        await until(pilot, lambda: app.status.get("state") == "ready" and app.status.get("pid") != first_pid,
                    LOAD_S, "the new engine in the status")

        screen.query_one("#opt-max-tokens").value = "4"
        await pilot.press("ctrl+r")  # the failed message again, on the new engine
        await chat_turn_done(pilot, screen, 2, "the reply after the reload")


async def test_q_asks_before_quitting_with_a_model_loaded_and_quitting_stops_the_engine(studio_env):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await load_from_models(pilot, studio_env)
        process = app.manager.loaded.child.process
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("n")
        assert app.current_mode == "status" and app.return_code is None
        await pilot.press("q", "y")
        await until(pilot, lambda: app.return_code is not None, 10, "the app to quit")
    assert process.returncode is not None  # the engine is stopped, not left running


async def test_quitting_while_a_reply_streams_cancels_it_instead_of_waiting_for_it(studio_env, tiny_llama_noeos):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await load_from_models(pilot, tiny_llama_noeos.name)  # no end token: the reply runs to the context's end
        process = app.manager.loaded.child.process
        screen = await start_a_reply(app, pilot, max_tokens=100000)
        reply = screen.query(".-assistant").last(ChatMessage)
        # Keys as a terminal sends them (Pilot's press waits for an idle app, which a streaming one is not):
        # to Status (in the chat box q is typed, Escape stops the reply), q, and y to confirm.
        app.simulate_key("f3")
        await until(pilot, lambda: app.current_mode == "status", 30, "the Status screen")
        app.simulate_key("q")
        await until(pilot, lambda: isinstance(app.screen, QuitScreen), 30, "the quit question")
        assert screen.streaming, "the reply ended before the quit: nothing left to cancel"
        app.simulate_key("y")
        await until(pilot, lambda: app.return_code is not None, 30, "the app to quit")
    # Quitting stopped the reply where it was (the engine is stopped with it), it did not wait for its end.
    assert reply.border_subtitle.endswith("stopped"), reply.border_subtitle
    assert process.returncode is not None
