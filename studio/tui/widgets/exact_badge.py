"""The big EXACT ON / OFF / UNAVAILABLE badge, with the reason when the engine did not grant it."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

LABELS = {"on": "EXACT ON", "off": "EXACT OFF", "unavailable": "EXACT UNAVAILABLE"}


class ExactBadge(Static):
    # on / off / unavailable as the manager reports it; loading, stopped and failed have no grant yet.
    state: reactive[str] = reactive("none")

    def render(self) -> str:
        return LABELS.get(self.state, {"loading": "LOADING…", "failed": "NOT RUNNING"}.get(self.state, "NO MODEL"))

    def watch_state(self, old: str, new: str) -> None:
        self.remove_class(f"-{old}")
        self.add_class(f"-{new}")
