"""Screens as a new user meets them: built before their first visit, sized when they are filled, and
showing what is stored now (the real app, LoadManager and settings store, driven by Textual's Pilot)."""

from __future__ import annotations

import gc

from textual.geometry import Region
from textual.screen import Screen
from textual.widgets import DataTable

from settings import SettingsStore
from studio.catalog import Catalog, ModelInfo
from studio.manager import LoadManager
from studio.tui.app import LockstepApp
from studio.tui.navigation import PLACES
from studio.tui.screens.models import COLUMNS
from tests.tui_helpers import until

SIZE = (120, 40)
WAIT_S = 120.0  # a bound on a hang on a loaded machine, not a speed check


def offline_app(tmp_path) -> LockstepApp:
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([], include_bundled=False), env={},
                          logs=tmp_path / "logs")
    return LockstepApp(manager, api=False)


async def test_every_screen_is_built_in_idle_time_so_a_first_visit_composes_and_restyles_nothing(tmp_path,
                                                                                                 monkeypatch):
    restyled: list[Screen] = []
    real = Screen.update_node_styles
    monkeypatch.setattr(Screen, "update_node_styles",
                        lambda self, animate=True: (restyled.append(self), real(self, animate))[1])
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.prebuild_worker is not None and app.prebuild_worker.is_finished, WAIT_S,
                    "the screens to be built")
        assert set(app._screen_stacks) == {p.mode for p in PLACES}
        assert gc.get_freeze_count() > 0, "the built screens are left to every full collection"
        for place in PLACES[1:]:
            screen = app._screen_stacks[place.mode][0]
            widgets = {id(w) for w in screen.walk_children()}
            restyled.clear()
            await pilot.press(f"f{place.number}")
            await pilot.pause()
            assert app.screen is screen
            # The same widgets, footer keys included: nothing composed, mounted or rebuilt on the visit.
            assert {id(w) for w in screen.walk_children()} == widgets, place.mode
            assert screen not in restyled, f"the first visit to {place.mode} restyled the screen"
            assert screen.query_one("KeyFooter").children, "the footer shows no keys"
    assert gc.get_freeze_count() == 0, "the app left its objects frozen"


async def test_the_models_table_is_sized_with_its_rows_not_on_a_later_idle_pass(tmp_path):
    app = offline_app(tmp_path)
    models = [ModelInfo(id="a-model-with-a-long-name-q8_0", path="/m/a.gguf", format="gguf", architecture="qwen2",
                        parameters=494_000_000, size_bytes=531_000_000, native_context=32768,
                        quant_mix="Q8_0: Q8_0 169, F32 121")]
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.models is not None, WAIT_S, "the first scan")
        screen = app.screen
        screen._show_models(models)
        table = screen.query_one(DataTable)
        # Before any idle pass: a frame painted now must not cut the cells to the column labels.
        widths = {str(c.label): c.get_render_width(table) - 2 * table.cell_padding for c in table.columns.values()}
        assert widths["model"] >= len(models[0].id) and widths["quant mix"] >= len(models[0].quant_mix), widths
        assert list(widths) == list(COLUMNS)


async def test_settings_show_a_change_made_elsewhere_when_revisited(tmp_path):
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f7")
        screen = app.screen
        assert screen.query_one("#set-exact").value == "unset"
        await pilot.press("f1")
        SettingsStore(tmp_path / "config").update({"exact_concurrency": "on"})  # the REST API or another studio
        await pilot.press("f7")
        await until(pilot, lambda: screen.query_one("#set-exact").value == "on", WAIT_S, "the form to reload")
        await pilot.press("ctrl+s")  # saving what is shown is not a conflict
        await until(pilot, lambda: "saved" in " ".join(str(n.message) for n in app._notifications), WAIT_S,
                    "the save")
        assert not screen.query_one("#settings-error").display


async def test_an_edited_settings_form_keeps_the_edit_and_says_the_file_changed(tmp_path):
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f7")
        screen = app.screen
        screen.query_one("#set-api_port").value = "9999"
        await pilot.press("f1")
        SettingsStore(tmp_path / "config").update({"exact_concurrency": "on"})
        await pilot.press("f7")
        error = screen.query_one("#settings-error")
        await until(pilot, lambda: error.display, WAIT_S, "the note that the file changed")
        assert "changed since this form was filled" in str(error.render())
        assert screen.query_one("#set-api_port").value == "9999"  # the user's typing is not thrown away


def shown(widget) -> str:
    """The text a widget shows in the region it has (cut where the region cuts it)."""
    return "\n".join(strip.text for strip in widget.render_lines(Region(0, 0, *widget.size)))


async def test_at_80x24_the_header_keeps_the_model_and_its_exact_state(tmp_path):
    app = LockstepApp(offline_app(tmp_path).manager, api=False, poll_interval=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.status.get("state") == "stopped", WAIT_S, "the first status poll")
        app.status = {"model": "qwen2.5-0.5b-instruct-q8_0", "state": "ready", "exact_concurrency": "on"}
        for key in ("f1", "f3", "f4", "f7"):
            await pilot.press(key)
            await pilot.pause()
            text = shown(app.screen.query_one("#nav-summary"))
            assert "qwen2.5-0.5b-instruct-q8_0" in text and "EXACT ON" in text, (key, text)
