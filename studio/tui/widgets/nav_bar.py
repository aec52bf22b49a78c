"""The top line of every screen: where you are, the number keys, and the loaded model at a glance."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Static

from studio.tui.navigation import PLACES


def nav_content(current: str) -> Content:
    parts: list[Content] = []
    for place in PLACES:
        style = "reverse b" if place.mode == current else ""
        _keys, key_label = place.bindings()
        label = Content.from_markup(" [b]$key[/b] $title ", key=key_label, title=place.title)
        if style:
            label = label.stylize(style)
        parts.append(label.stylize(f"@click=app.goto('{place.mode}')"))
    return Content("").join(parts)


def summary_content(status: dict[str, Any], loading: Any) -> Content:
    if loading is not None:
        return Content.from_markup("[b]$model[/b] loading…", model=loading.model)
    model = status.get("model")
    state = status.get("state") or "stopped"
    if not model or state == "stopped":
        return Content("no model loaded")
    if state != "ready":
        return Content.from_markup(f"[b $error]{state}[/] $model", model=model)
    exact = status.get("exact_concurrency")
    badge = {"on": "[b $success]EXACT ON[/]", "off": "[dim]exact off[/]",
             "unavailable": "[b $warning]EXACT UNAVAILABLE[/]"}.get(exact or "", "")
    return Content.from_markup(f"[$success]●[/] $model {badge}", model=model)


class NavBar(Horizontal):
    def __init__(self, current: str) -> None:
        super().__init__(id="nav-bar")
        self.current = current

    def compose(self) -> ComposeResult:
        yield Static("Lockstep", id="nav-brand")
        yield Static(nav_content(self.current), id="nav-places")
        yield Static("", id="nav-summary")

    def on_mount(self) -> None:
        self.watch(self.app, "status", self._refresh_summary, init=True)
        self.watch(self.app, "loading", self._refresh_summary, init=False)

    def _refresh_summary(self, _value: object = None) -> None:
        self.query_one("#nav-summary", Static).update(summary_content(self.app.status, self.app.loading))
