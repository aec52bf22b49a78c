"""The footer of key bindings, rebuilt only when the keys it shows change."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


def shown_keys(screen: Screen) -> tuple:
    return tuple((binding.key, binding.description, enabled, tooltip)
                 for _node, binding, enabled, tooltip in screen.active_bindings.values() if binding.show)


class KeyFooter(Footer):
    """Textual's Footer rebuilds its keys (twenty widgets, each styled anew) on every screen switch and focus
    change, since each refreshes the bindings: most of a switch's time. The keys rarely differ: this
    footer rebuilds only when they do."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shown: tuple | None = None

    def bindings_changed(self, screen: Screen) -> None:
        if not screen.app.app_focus:  # Footer ignores the change then; the next one must not be skipped
            super().bindings_changed(screen)
            return
        shown = shown_keys(screen)
        if shown != self._shown:
            self._shown = shown
            super().bindings_changed(screen)
