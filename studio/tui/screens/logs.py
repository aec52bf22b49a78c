"""Logs: the engine's output for each attempt of the last load, and the studio's own log."""

from __future__ import annotations

import asyncio
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import OptionList, RichLog, Static
from textual.widgets.option_list import Option

from studio.tui.messages import LogsRead
from studio.tui.screens.base import StudioScreen, keys

TAIL_BYTES = 256 * 1024


def attempt_label(attempt: dict[str, Any]) -> str:
    change = f" — {attempt['change']}" if attempt.get("change") else ""
    return f"attempt {attempt['attempt']}: {attempt.get('outcome', '?')}{change}"


class LogsScreen(StudioScreen, mode="logs", focus="#log-list"):
    BINDINGS = keys(("r", "refresh", "Refresh"))

    def compose_body(self) -> ComposeResult:
        yield Static(Content.from_markup("[dim]this studio's logs:[/dim] $d", d=str(self.studio.manager.log_dir)),
                     id="log-folder")
        with Horizontal(id="logs-body"):
            yield OptionList(id="log-list")
            # Long lines (an argv, a traceback) wrap at the pane's width (min_width: RichLog's 78 would cut them)
            yield RichLog(id="log-text", wrap=True, min_width=20, markup=False, highlight=False, auto_scroll=True)

    def on_mount(self) -> None:
        self._logs: dict[str, Any] = {"attempts": [], "studio": ""}
        self._shown: str | None = None
        self.watch(self.app, "load_outcome", lambda _v: self.action_refresh(), init=False)

    def on_screen_resume(self) -> None:
        self.action_refresh()

    def action_refresh(self) -> None:
        self.read_logs()

    @work(exclusive=True, group="logs")
    async def read_logs(self) -> None:
        # The manager reads files: a thread keeps the event loop free.
        logs = await asyncio.to_thread(self.studio.manager.logs, TAIL_BYTES)
        self.post_message(LogsRead(logs))

    def on_logs_read(self, message: LogsRead) -> None:
        self._logs = message.logs
        options = self.query_one(OptionList)
        keep = self._shown
        options.clear_options()
        attempts = message.logs.get("attempts") or []
        for i, attempt in enumerate(attempts):
            options.add_option(Option(attempt_label(attempt), id=f"attempt-{i}"))
        options.add_option(Option("studio log", id="studio"))
        ids = [f"attempt-{i}" for i in range(len(attempts))] + ["studio"]
        # The newest attempt is what a user opening the Logs screen is after.
        choice = keep if keep in ids else ids[-2] if len(ids) > 1 else "studio"
        options.highlighted = ids.index(choice)
        self._show(choice)

    @on(OptionList.OptionHighlighted)
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id is not None and event.option.id != self._shown:
            self._show(event.option.id)

    def _show(self, option_id: str) -> None:
        self._shown = option_id
        if option_id == "studio":
            text = self._logs.get("studio") or "(the studio log is empty)"
        else:
            attempt = self._logs["attempts"][int(option_id.split("-")[1])]
            text = attempt.get("text") or "(no output)"
        log = self.query_one(RichLog)
        log.clear()
        log.write(text)
