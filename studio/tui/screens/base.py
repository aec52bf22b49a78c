"""What every studio screen shares: the nav bar on top and the footer of key bindings."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Select, TextArea

from studio.tui.widgets.nav_bar import NavBar

if TYPE_CHECKING:
    from studio.tui.app import LockstepApp


class StudioScreen(Screen):
    MODE: ClassVar[str] = ""
    # Escape leaves a typing field, so the screen's single-letter keys act again.
    BINDINGS = [Binding("escape", "leave_field", "Leave field")]

    @property
    def studio(self) -> LockstepApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield NavBar(self.MODE)
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def _in_field(self) -> bool:
        return isinstance(self.focused, (Input, Select, TextArea))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "leave_field":
            return self._in_field()
        return True

    def on_descendant_focus(self) -> None:
        self.refresh_bindings()

    def on_descendant_blur(self) -> None:
        self.refresh_bindings()

    def action_leave_field(self) -> None:
        self.set_focus(None)
