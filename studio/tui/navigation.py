"""The screens in the order of their number keys; the nav bar, the bindings and the palette read this."""

from __future__ import annotations

from typing import NamedTuple


class Place(NamedTuple):
    mode: str
    key: str
    title: str
    help: str


PLACES: tuple[Place, ...] = (
    Place("models", "1", "Models", "the models on disk; Enter loads one"),
    Place("load", "2", "Load", "load settings with live validation"),
    Place("status", "3", "Status", "engine state, exact badge, slots, pages"),
    Place("chat", "4", "Chat", "chat with the loaded model"),
    Place("exactness", "5", "Exactness", "run the exactness evidence matrix"),
    Place("logs", "6", "Logs", "the engine's log for each attempt"),
    Place("settings", "7", "Settings", "stored settings"),
)
