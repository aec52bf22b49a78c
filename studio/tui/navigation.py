"""The screens in the order of their function keys; the nav bar, the bindings and the palette read this.

Screen switching uses keys that never type a character (F1-F7, or Alt with the digit where a terminal
keeps the function keys for itself), so switching works from inside a text field and never writes into it.
"""

from __future__ import annotations

from typing import NamedTuple


class Place(NamedTuple):
    mode: str
    number: int
    title: str
    help: str

    def bindings(self) -> tuple[str, str]:
        """The keys that go to this place (as a Binding names them) and the label the nav bar shows."""
        return f"f{self.number},alt+{self.number}", f"F{self.number}"


PLACES: tuple[Place, ...] = (
    Place("models", 1, "Models", "the models on disk; Enter loads one"),
    Place("load", 2, "Load", "load settings with live validation"),
    Place("status", 3, "Status", "engine state, exact badge, slots, pages"),
    Place("chat", 4, "Chat", "chat with the loaded model"),
    Place("exactness", 5, "Exactness", "run the exactness evidence matrix"),
    Place("logs", 6, "Logs", "the engine's log for each attempt"),
    Place("settings", 7, "Settings", "stored settings"),
)
