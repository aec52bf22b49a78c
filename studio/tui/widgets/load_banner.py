"""Load progress and the load's verdict, on the screen where the user started the load."""

from __future__ import annotations

import os
import time

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static


def engine_progress(log_path: str | None, tail_bytes: int = 8192) -> str:
    """The engine's memory plan and its latest line, from the running attempt's log (a small tail read)."""
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = [ln.strip() for ln in f.read().decode("utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not ln.startswith("#")]  # the studio's own header lines
    plan = next((ln[ln.index("memory: needs"):] for ln in reversed(lines) if "memory: needs" in ln), None)
    parts = [plan] if plan else []
    if lines and (plan is None or plan not in lines[-1]):
        parts.append(f"engine: {lines[-1][-160:]}")
    return "\n".join(parts)


class LoadBanner(Vertical):
    def __init__(self, origin: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.origin = origin

    def compose(self) -> ComposeResult:
        yield Static("", classes="load-banner-text", markup=False)
        yield ProgressBar(total=None, show_eta=False, show_percentage=False, classes="load-banner-bar")

    def on_mount(self) -> None:
        self.watch(self.app, "loading", self._refresh, init=False)
        self.watch(self.app, "load_outcome", self._refresh, init=True)
        self.set_interval(1.0, self._refresh)  # the ladder's attempts change without a reactive of their own

    def _attempt_note(self) -> str:
        """The ladder's progress: which attempt runs and what it changed, once past the first."""
        loaded = self.app.manager.loaded
        live = loaded.live if loaded is not None else []
        if len(live) < 2:
            return ""
        return f" attempt {live[-1].number}: {live[-1].change};"

    def _refresh(self, _value: object = None) -> None:
        text = self.query_one(".load-banner-text", Static)
        loading, outcome = self.app.loading, self.app.load_outcome
        self.set_class(False, "-loading", "-failed", "-loaded")
        if loading is not None:
            if loading.origin != self.origin:
                self.display = False
                return
            loaded = self.app.manager.loaded
            live = loaded.live if loaded is not None else []
            progress = engine_progress(live[-1].log_path if live else None)
            elapsed = time.monotonic() - loading.started
            text.update(f"Loading {loading.model} (exact concurrency {loading.exact})… {elapsed:.0f} s;"
                        f"{self._attempt_note()} each attempt's log is on the Logs screen (F6)"
                        + (f"\n{progress}" if progress else ""))
            self.add_class("-loading")
        elif outcome is not None and outcome.origin == self.origin:
            if outcome.ok:
                text.update(f"Loaded {outcome.model}")
                self.add_class("-loaded")
            else:
                kind = f" ({outcome.failure})" if outcome.failure else ""
                text.update(f"Load refused{kind}: {outcome.message}")
                self.add_class("-failed")
        else:
            self.display = False
            return
        self.display = True
