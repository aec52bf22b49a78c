"""The question `p` asks on the Models screen: which Hub repo (and optionally which file) to pull."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static


class PullScreen(ModalScreen[tuple[str, str | None] | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="pull-box"):
            yield Static("Pull a model from the Hugging Face Hub into the first model folder", id="pull-title")
            yield Label("Repo id, e.g. Qwen/Qwen2.5-0.5B-Instruct")
            yield Input(placeholder="owner/name", id="pull-repo")
            yield Label("File (a GGUF in the repo); blank = the whole safetensors model")
            yield Input(placeholder="e.g. qwen2.5-0.5b-instruct-q8_0.gguf", id="pull-file")
            yield Static("Enter starts · Escape cancels · a stopped pull resumes where it left off",
                         id="pull-help")

    @on(Input.Submitted)
    def _submit(self) -> None:
        repo = self.query_one("#pull-repo", Input).value.strip()
        if not repo:
            self.query_one("#pull-repo", Input).focus()
            return
        file = self.query_one("#pull-file", Input).value.strip() or None
        self.dismiss((repo, file))
