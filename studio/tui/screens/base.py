"""What every studio screen shares: the nav bar on top and the footer of key bindings."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from studio.tui.widgets.nav_bar import NavBar

if TYPE_CHECKING:
    from studio.tui.app import LockstepApp


class StudioScreen(Screen):
    MODE: ClassVar[str] = ""

    @property
    def studio(self) -> LockstepApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield NavBar(self.MODE)
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()
