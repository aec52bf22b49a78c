"""The question `q` asks before quitting stops a loaded model: y/Enter quits, n/Escape stays."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


class QuitScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y,enter,q", "answer(True)", "Quit", priority=True),
        Binding("n,escape", "answer(False)", "Stay", priority=True),
    ]

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    def compose(self) -> ComposeResult:
        with Vertical(id="quit-box"):
            yield Static(Content.from_markup(
                "Quit Lockstep? [b]$model[/b] is loaded: quitting stops its engine and any request it "
                "is serving.\n\n[b]y[/b] / [b]Enter[/b] quit    [b]n[/b] / [b]Escape[/b] stay", model=self.model),
                id="quit-question")

    def action_answer(self, quit_: bool) -> None:
        if quit_:
            self.app.exit()  # at once: dismissing first would resume and repaint the screen underneath
        else:
            self.dismiss(False)
