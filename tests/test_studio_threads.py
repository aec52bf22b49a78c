"""The studio's `threads` load setting: "auto" (no -t: the engine's default, one per physical core) or a
number (-t N); through /api/load, the settings file, the Settings screen and the Load form, with the
count the engine reports shown on the Status screen. Real engine children on the CPU backend."""

from __future__ import annotations

import json

import pytest

from settings import LoadDefaults, SettingsStore
from studio.flags import ExtraArgsError, options_from_settings, parse_extra_args
from studio.tui.app import LockstepApp
from tests.studio_helpers import in_process_studio
from tests.test_tui_pilot import LOAD_S, SIZE, pick_model, studio_env  # noqa: F401  (the studio_env fixture)
from tests.tui_helpers import until

BAD = [0, -1, 257, "many", 2.5, True, ""]


def test_auto_passes_no_flag_and_a_number_passes_minus_t():
    assert "--threads" not in options_from_settings(LoadDefaults())
    assert options_from_settings(LoadDefaults(threads=3))["--threads"] == "3"
    assert options_from_settings(LoadDefaults(threads="2"))["--threads"] == "2"  # a form's text
    # extra args may still set it, as the engine takes it: >= 1, or -1 for its default
    assert parse_extra_args(["-t", "-1"]) == {"--threads": "-1"}
    with pytest.raises(ExtraArgsError, match="-t expects an integer >= 1"):
        parse_extra_args(["-t", "0"])


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_value_is_refused_by_the_settings_model(bad):
    with pytest.raises(ValueError, match="expects 'auto'"):
        LoadDefaults(threads=bad)


async def test_api_load_threads_reach_the_engine_and_bad_ones_change_nothing(tmp_path, tiny_llama):
    client = await in_process_studio(tmp_path, tiny_llama)
    try:
        resp = await client.post("/api/load", json={"model": client.model, "threads": 2})
        body = await resp.json()
        assert resp.status == 200, body
        assert body["threads"] == "2" and body["threads_in_use"] == 2
        assert body["argv"][body["argv"].index("--threads") + 1] == "2"
        pid = body["pid"]
        settings_before = (tmp_path / "config" / "settings.json").read_bytes() if (
            tmp_path / "config" / "settings.json").exists() else None
        for bad in BAD:
            resp = await client.post("/api/load", json={"model": client.model, "threads": bad})
            answer = await resp.json()
            assert resp.status == 400, answer
            assert "threads" in answer["error"]["message"] and "expects 'auto'" in answer["error"]["message"]
            resp = await client.put("/api/settings", json={"load": {"threads": bad}})
            assert resp.status == 400, await resp.text()
        status = await (await client.get("/api/status")).json()
        assert status["pid"] == pid and status["state"] == "ready" and status["threads_in_use"] == 2
        after = (tmp_path / "config" / "settings.json")
        assert (after.read_bytes() if after.exists() else None) == settings_before

        # auto: no -t, so the engine's default; the suite's LLAMA_ARG_THREADS=1 (conftest) is that default here
        resp = await client.put("/api/settings", json={"load": {"threads": "auto"}})
        assert resp.status == 200, await resp.text()
        resp = await client.post("/api/load", json={"model": client.model})
        body = await resp.json()
        assert resp.status == 200, body
        assert body["threads"] == "auto" and "--threads" not in body["argv"] and body["threads_in_use"] == 1
    finally:
        await client.close()


async def test_the_settings_screen_saves_threads_and_refuses_a_bad_value(studio_env, tmp_path):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f7")
        screen = app.screen
        field = screen.query_one("#set-threads")
        assert field.value == "auto"
        field.value = "0"
        await pilot.press("ctrl+s")
        error = screen.query_one("#settings-error")
        await until(pilot, lambda: error.display, 30, "the refusal")
        assert "CPU threads expects 'auto'" in str(error.render())
        assert not (tmp_path / "config" / "settings.json").exists()  # nothing was written
        field.value = "3"
        await pilot.press("ctrl+s")
        path = tmp_path / "config" / "settings.json"
        await until(pilot, lambda: path.exists() and not error.display, 30, "the save")
        assert json.loads(path.read_text())["load"]["threads"] == 3
        assert SettingsStore(tmp_path / "config").settings.load.threads == 3


async def test_the_load_form_checks_threads_and_the_status_shows_the_count_in_use(studio_env):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await pick_model(pilot, studio_env)
        await pilot.press("f2")
        form = app.screen
        field, help_text = form.query_one("#field-threads"), form.query_one("#help-threads")
        assert field.value == "auto"
        field.value = "zero"
        await until(pilot, lambda: form.query_one("#load-button").disabled, 30, "the field's refusal")
        assert "expects 'auto'" in str(help_text.render()) and "-invalid" in field.classes
        field.value = "2"
        await until(pilot, lambda: not form.query_one("#load-button").disabled, 30, "the field to be accepted")
        await pilot.press("ctrl+l")
        await until(pilot, lambda: app.current_mode == "status" and app.status.get("state") == "ready",
                    LOAD_S, "the load")
        assert app.status["threads_in_use"] == 2
        info = app.screen.query_one("#engine-info")
        await until(pilot, lambda: "2 (set to 2)" in str(info.render()), 30, "the thread count on Status")
