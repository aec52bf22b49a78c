"""Settings: what the settings store keeps, edited and saved through it (atomic writes)."""

from __future__ import annotations

import os
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, HorizontalGroup, VerticalScroll
from textual.content import Content
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from settings import EXACT_MODES, PREEMPT_MODES, Settings, threads_value
from settings.env import ENV_MODEL_DIRS
from settings.store import version_of
from studio.tui.messages import SettingsOnDisk, SettingsSaved, settings_saved
from studio.tui.screens.base import StudioScreen, keys

NOT_SET = "unset"


def settings_patch(values: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The store patch for the form's text, and per-field problems."""
    errors: dict[str, str] = {}
    patch: dict[str, Any] = {
        "exact_concurrency": None if values["exact"] == NOT_SET else values["exact"],
        "preempt_mode": None if values["preempt"] == NOT_SET else values["preempt"],
        "model_folders": [line.strip() for line in values["folders"].splitlines() if line.strip()],
        "api": {"host": values["api_host"].strip(), "api_key": values["api_key"] or None},
        "auto_load": values["auto_load"] == "on",
    }
    try:
        patch["api"]["port"] = int(values["api_port"])
    except ValueError:
        errors["api_port"] = f"a port number, not {values['api_port']!r}"
    try:
        patch["load"] = {"threads": threads_value(values["threads"].strip())}
    except ValueError as exc:
        errors["threads"] = f"CPU threads {exc}"
    try:
        patch["health_timeout_s"] = float(values["health_timeout"])
    except ValueError:
        errors["health_timeout"] = f"seconds, not {values['health_timeout']!r}"
    return patch, errors


class SettingsScreen(StudioScreen, mode="settings", focus="#set-exact"):
    BINDINGS = keys(("ctrl+s", "save", "Save"), ("ctrl+r", "revert", "Revert"))

    def compose_body(self) -> ComposeResult:
        exact_options = [("not set (off unless LOCKSTEP_EXACT=1 is inherited)", NOT_SET)] + [
            (m, m) for m in EXACT_MODES]
        preempt_options = [("not set (auto)", NOT_SET)] + [(m, m) for m in PREEMPT_MODES]
        with VerticalScroll(id="settings-form"):
            yield Static("", id="settings-file")
            yield Static("", id="settings-problems")
            with HorizontalGroup(classes="field-row"):
                yield Label("Exact concurrency", classes="field-label")
                yield Select(exact_options, allow_blank=False, id="set-exact", compact=True)
                yield Static("", id="help-exact", classes="field-help")
            with HorizontalGroup(classes="field-row"):
                yield Label("Preemption mode", classes="field-label")
                yield Select(preempt_options, allow_blank=False, id="set-preempt", compact=True)
                yield Static("park: copy to host memory; recompute: drop and recompute", classes="field-help")
            with HorizontalGroup(classes="field-row"):
                yield Label("Load on demand", classes="field-label")
                yield Select([("off", "off"), ("on", "on")], allow_blank=False, id="set-auto_load", compact=True)
                yield Static("on: a /v1 request loads the catalog model it names", classes="field-help")
            with HorizontalGroup(classes="field-row -tall"):
                yield Label("Model folders", classes="field-label")
                yield TextArea(id="set-folders", soft_wrap=False, compact=True)
                yield Static("", id="help-folders", classes="field-help")
            for name, label, help_text in (
                ("api_host", "API host", "the REST API's address; non-loopback exposes the studio"),
                ("api_port", "API port", "applies at the next start of lockstep"),
                ("api_key", "API key", "blank: no key (loopback only is advised)"),
                ("health_timeout", "Load timeout (s)", "how long a load waits for the engine's /health"),
                ("threads", "CPU threads", "auto: one per physical core (the engine's default); or a number (-t)"),
            ):
                with HorizontalGroup(classes="field-row"):
                    yield Label(label, classes="field-label")
                    yield Input(id=f"set-{name}", compact=True, password=name == "api_key")
                    yield Static(help_text, id=f"help-{name}", classes="field-help")
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Save", id="settings-save", variant="primary")
                yield Button("Revert", id="settings-revert")
            yield Static(Content.from_markup(
                "Other load defaults (context, slots, cache types, extra args…) are saved from the "
                "[b]Load[/b] screen (F2) with [b]ctrl+s[/b]."), id="settings-note")

    def on_mount(self) -> None:
        self.action_revert()

    def on_screen_resume(self) -> None:
        # The REST API or another studio may have written the file since the form was filled.
        self.read_version()

    @work(thread=True, exclusive=True, group="settings-version")
    def read_version(self) -> None:
        try:
            raw: bytes | None = self.studio.manager.store.path.read_bytes()
        except FileNotFoundError:
            raw = None
        except OSError:
            return  # the store reports an unreadable file itself
        self.post_message(SettingsOnDisk(version_of(raw)))

    def on_settings_on_disk(self, message: SettingsOnDisk) -> None:
        if message.version == self._version:
            return
        if self.values() == self._filled:
            self.action_revert()  # nothing typed here: show what is stored now
        else:
            self._set_error("the settings file changed since this form was filled: ctrl+r (Revert) loads it; "
                            "a save now would be refused")

    def action_revert(self) -> None:
        manager = self.studio.manager
        # What is on disk now (another studio or the REST API may have written it); a save names this version.
        s: Settings = manager.store.refresh()
        self._version = manager.store.version
        self.query_one("#set-exact", Select).value = s.exact_concurrency or NOT_SET
        self.query_one("#set-preempt", Select).value = s.preempt_mode or NOT_SET
        self.query_one("#set-auto_load", Select).value = "on" if s.auto_load else "off"
        self.query_one("#set-folders", TextArea).text = "\n".join(s.model_folders)
        self.query_one("#set-api_host", Input).value = s.api.host
        self.query_one("#set-api_port", Input).value = str(s.api.port)
        self.query_one("#set-api_key", Input).value = s.api.api_key or ""
        self.query_one("#set-health_timeout", Input).value = f"{s.health_timeout_s:g}"
        self.query_one("#set-threads", Input).value = str(s.load.threads)
        self.query_one("#settings-file", Static).update(
            Content.from_markup("[dim]settings file[/dim]  $p", p=str(manager.store.path)))
        problems = [p.message() for p in manager.store.problems]
        box = self.query_one("#settings-problems", Static)
        box.update("\n".join(f"⚠ {p}" for p in problems))
        box.display = bool(problems)
        self._show_context()
        self._set_error("")
        self._filled = self.values()

    def _show_context(self) -> None:
        manager = self.studio.manager
        try:
            view = manager.exact_view()
            effective = f"in effect: {view['effective']}"
            if view.get("env_override"):
                effective += f" (LOCKSTEP_EXACT_CONCURRENCY={view['env_override']} outranks this)"
            if view.get("reload_required"):
                effective += "; the loaded model runs with another setting until it is loaded again"
        except Exception as exc:  # a bad environment variable is worth showing, not crashing on
            effective = str(getattr(exc, "message", exc))
        self.query_one("#help-exact", Static).update(effective)
        extra = [p for p in manager.env.get(ENV_MODEL_DIRS, "").split(os.pathsep) if p]
        help_text = "one folder per line; the bundled assets/models is always scanned"
        if extra:
            help_text += f"; {ENV_MODEL_DIRS} adds: " + ", ".join(extra)
        self.query_one("#help-folders", Static).update(help_text)

    def values(self) -> dict[str, str]:
        return {
            "exact": str(self.query_one("#set-exact", Select).value),
            "preempt": str(self.query_one("#set-preempt", Select).value),
            "auto_load": str(self.query_one("#set-auto_load", Select).value),
            "folders": self.query_one("#set-folders", TextArea).text,
            "api_host": self.query_one("#set-api_host", Input).value,
            "api_port": self.query_one("#set-api_port", Input).value,
            "api_key": self.query_one("#set-api_key", Input).value,
            "health_timeout": self.query_one("#set-health_timeout", Input).value,
            "threads": self.query_one("#set-threads", Input).value,
        }

    @on(Button.Pressed, "#settings-revert")
    def _revert_pressed(self) -> None:
        self.action_revert()

    @on(Input.Submitted)
    @on(Button.Pressed, "#settings-save")
    def action_save(self) -> None:
        patch, errors = settings_patch(self.values())
        if errors:
            self._set_error("; ".join(errors.values()))
            return
        self.save(patch)

    @work(thread=True, exclusive=True, group="save-settings")
    def save(self, patch: dict[str, Any]) -> None:
        store = self.studio.manager.store
        self.post_message(settings_saved(lambda: store.update(patch, expected_version=self._version),
                                         conflict_hint=": press ctrl+r (Revert) to load the current settings"))

    def on_settings_saved(self, message: SettingsSaved) -> None:
        if message.error:
            self._set_error(f"not saved: {message.error}")
            return
        self._version = self.studio.manager.store.version
        self._filled = self.values()  # what is stored now
        self._set_error("")
        self._show_context()
        self.notify("settings saved")
        self.studio.rescan()  # the model folders may have changed

    def _set_error(self, text: str) -> None:
        box = self.query_one("#settings-error", Static)
        box.update(text)
        box.display = bool(text)
