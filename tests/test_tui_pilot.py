"""The TUI driven by Pilot against the real engine child on the CPU backend.

The studio is configured the way a user's shell would: LOCKSTEP_CONFIG_DIR and LOCKSTEP_LOG_DIR
point at temporary folders and LOCKSTEP_MODEL_DIRS at the folder holding the tiny llama. Every wait
polls the UI for what a person would see, with a deadline.
"""

from __future__ import annotations

import functools
import importlib
import socket
import subprocess
import sys

import aiohttp
import pytest

from studio.tui.app import LockstepApp
from studio.tui.widgets.chat_message import ChatMessage
from studio.tui.widgets.exact_badge import ExactBadge
from tests.tui_helpers import until  # noqa: F401  (re-exported to the other TUI tests)

SIZE = (120, 40)
LOAD_S = 120
CHAT_S = 120
EVIDENCE_S = 900


@functools.cache
def engine_broken() -> str | None:
    """Why the engine cannot start, or None: a broken engine fails these tests, it never skips them."""
    try:
        importlib.import_module("engine.cli")
    except Exception as exc:
        return f"engine.cli is not importable ({type(exc).__name__}: {exc})"
    try:
        done = subprocess.run([sys.executable, "-m", "engine", "--help"], capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "python -m engine --help did not finish"
    if done.returncode != 0:
        return f"python -m engine --help exits {done.returncode}"
    return None


@pytest.fixture
def studio_env(tmp_path, tiny_llama, monkeypatch):
    reason = engine_broken()
    if reason:
        pytest.fail(reason)
    for name in ("LOCKSTEP_EXACT_CONCURRENCY", "LOCKSTEP_EXACT", "LOCKSTEP_PREEMPT_MODE", "LOCKSTEP_API_PORT",
                 "LOCKSTEP_API_HOST", "LOCKSTEP_API_KEY", "LOCKSTEP_PREEMPT_EVERY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCKSTEP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("LOCKSTEP_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("LOCKSTEP_MODEL_DIRS", str(tiny_llama.parent))
    return tiny_llama.name


async def pick_model(pilot, model_id: str) -> None:
    """Highlight the model's row on the Models screen (the bundled default may sit above it)."""
    app = pilot.app
    await until(pilot, lambda: app.models is not None, 30, "the catalog scan")
    table = app.screen.query_one("#model-table")
    table.move_cursor(row=table.get_row_index(model_id))
    await pilot.pause()
    assert app.selected_model == model_id


def badge(app) -> ExactBadge:
    return app.screen.query_one(ExactBadge)


async def load_from_models(pilot, model_id: str) -> None:
    await pick_model(pilot, model_id)
    await pilot.press("enter")
    app = pilot.app
    await until(pilot, lambda: app.current_mode == "status" and app.status.get("state") == "ready",
                LOAD_S, "the load to finish and the Status screen")


async def test_five_keypresses_from_start_to_a_streamed_reply(studio_env, monkeypatch):
    """Enter (load the selected default), c (chat), type, Enter: the reply streams in pieces."""
    appended: list[str] = []
    real_append = ChatMessage.append

    def spy(self, piece):
        appended.append(piece)
        real_append(self, piece)

    monkeypatch.setattr(ChatMessage, "append", spy)
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        # No picking: the first row (the bundled default when installed, else the tiny model) is selected.
        await until(pilot, lambda: app.models is not None, 30, "the catalog scan")
        assert app.selected_model == app.models[0].id
        await pilot.press("enter")
        await until(pilot, lambda: app.current_mode == "status" and app.status.get("state") == "ready",
                    LOAD_S, "the load to finish and the Status screen")
        assert badge(app).state == "off"
        assert "EXACT OFF" in str(badge(app).render())

        await pilot.press("c")
        assert app.current_mode == "chat"
        assert app.focused is app.screen.query_one("#prompt")
        app.screen.query_one("#opt-max-tokens").value = "24"  # CPU time on a shared machine; not a keypress
        await pilot.press(*"hello", "enter")
        screen = app.screen
        await until(pilot, lambda: not screen.streaming and len(screen.conversation) == 2, CHAT_S,
                    "the first reply to finish")
        reply = screen.query(".-assistant").last(ChatMessage)
        assert len(appended) >= 2, "the reply arrived in one piece, not streamed"
        assert reply.text == "".join(appended) and reply.text
        assert "seed" in reply.border_subtitle

        await pilot.press(*"again", "enter")
        await until(pilot, lambda: not screen.streaming and len(screen.conversation) == 4, CHAT_S,
                    "the second reply, with the first turn kept in the conversation")
        assert [m["role"] for m in screen.conversation] == ["user", "assistant", "user", "assistant"]
        assert not screen.query(".-error")


async def load_form_with_exact_on(app, pilot, env):
    """The load screen for the picked model, its exact field set to on."""
    await pick_model(pilot, env)
    await pilot.press("f2")
    form = app.screen
    form.query_one("#field-exact").value = "on"
    return form


async def test_exact_on_shows_the_on_badge(studio_env):
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        form = await load_form_with_exact_on(app, pilot, studio_env)
        await pilot.pause()
        assert "requested as on (chosen here)" in str(form.query_one("#load-exact").render())
        await pilot.press("ctrl+l")
        await until(pilot, lambda: app.current_mode == "status" and app.status.get("state") == "ready",
                    LOAD_S, "the exact-on load")
        assert app.status["exact_concurrency"] == "on"
        assert badge(app).state == "on" and "-on" in badge(app).classes
        assert str(badge(app).render()) == "EXACT ON"


async def test_refused_load_shows_the_message_on_the_load_screen(studio_env):
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        form = await load_form_with_exact_on(app, pilot, studio_env)
        form.query_one("#field-extra_args").value = "-ctk q8_0"
        await pilot.pause()
        warnings = str(form.query_one("#load-warnings").render())
        assert "quantized KV cache" in warnings, "the contradiction is not warned about before loading"
        await pilot.press("ctrl+l")
        banner = form.query_one("#load-banner")
        await until(pilot, lambda: "-failed" in banner.classes, LOAD_S, "the refusal")
        assert app.current_mode == "load", "a refused load must stay where the user acted"
        text = str(banner.query_one(".load-banner-text").render())
        assert "exact_refusal" in text and "exact_concurrency is on" in text and "q8_0" in text
        # the banner comes from the load's own answer, the status from the next poll of the studio
        await until(pilot, lambda: app.status.get("state") == "failed", LOAD_S, "the failed state in the status")


async def test_exactness_check_every_cell_identical(studio_env):
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await load_from_models(pilot, studio_env)
        await pilot.press("f5")
        screen = app.screen
        await pilot.press("r")
        summary = screen.query_one("#exactness-summary")
        await until(pilot, lambda: summary.has_class("-good") or summary.has_class("-bad"), EVIDENCE_S,
                    "the evidence matrix")
        text = str(summary.render())
        assert summary.has_class("-good"), text
        table = screen.query_one("#exactness-cells")
        results = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
        assert len(results) >= 8 and all("identical" in r for r in results), results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_rest_api_drives_the_same_manager(studio_env):
    port = free_port()
    app = LockstepApp(api_port=port)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "REST API" in app.api_note, 30, "the API to start")
        assert f"127.0.0.1:{port}" in app.api_note
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{port}/api/load", json={"model": studio_env}) as resp:
                assert resp.status == 200, await resp.text()
        await until(pilot, lambda: app.status.get("model") == studio_env and app.status.get("state") == "ready",
                    30, "the TUI to show the model a script loaded")


async def test_taken_port_keeps_the_tui_running_without_the_api(studio_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = LockstepApp(api_port=port)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.api_note.startswith("REST API off"), 30, "the API verdict")
            assert "in use" in app.api_note
            await load_from_models(pilot, studio_env)
            assert str(port) in str(app.screen.query_one("#api-note").render())
