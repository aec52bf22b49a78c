"""What every studio screen shares: the nav bar on top and the footer of key bindings."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Input, Select, TextArea

from studio.tui.widgets.key_footer import KeyFooter
from studio.tui.widgets.nav_bar import NavBar

if TYPE_CHECKING:
    from studio.tui.app import LockstepApp


def keys(*specs: tuple[str, str, str]) -> list[Binding]:
    """A screen's bindings from (key, action, description) triples."""
    return [Binding(key, action, description) for key, action, description in specs]


class StudioScreen(Screen):
    """A place in the studio: `class ChatScreen(StudioScreen, mode="chat", focus="#prompt")`."""

    MODE: ClassVar[str] = ""
    # Escape leaves a typing field, so the screen's single-letter keys act again.
    BINDINGS = [Binding("escape", "leave_field", "Leave field")]

    def __init_subclass__(cls, mode: str = "", focus: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.MODE = mode or cls.MODE
        cls.AUTO_FOCUS = focus or cls.AUTO_FOCUS

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Textual restyles the whole app (re-parsing every stylesheet), twice, when it switches to a screen
        # whose style stamp lags the app's, and a new screen starts without one. Mounting styles a screen
        # with the current CSS anyway, once the stylesheet has been parsed with the current stamp's theme
        # variables (the first screen waits for that); a theme change still bumps the stamp and restyles.
        if self.app.css_refreshed_at == self.app._css_update_count:
            self._css_update_count = self.app._css_update_count
        self._styled_once = False

    def _on_mount(self, event: events.Mount) -> None:
        # The same for a screen made before the app's first styling and mounted after it (the first screen):
        # its widgets were styled with the current stylesheet, and a lagging stamp would restyle everything
        # on the first return to it.
        if self.app.css_refreshed_at == self.app._css_update_count:
            self._css_update_count = self.app._css_update_count

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        # Runs before Screen's own handler (Textual walks the MRO from the subclass). The first resume
        # styles the new screen with the theme's variables; after that a resumed screen keeps its styles,
        # since nothing restyles a suspended one (a theme change goes through the stamp above).
        if self._styled_once:
            event.refresh_styles = False
        self._styled_once = True

    @property
    def studio(self) -> LockstepApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield NavBar(self.MODE)
        yield from self.compose_body()
        yield KeyFooter()

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
