"""Load progress and the load's verdict, on the screen where the user started the load."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from studio.tui.format import size

PHASE_TEXT = {
    "read": "reading the model file",
    "kernels": "preparing the compute kernels (a first load compiles them; later loads reuse them)",
    "weights": "storing the weights",
    "warmup": "warming up (self-check, scheduler start)",
}


def describe(progress: dict | None) -> str:
    """The engine's load progress (studio.load_progress.read_progress, carried by the status) for a person:
    the phase with its counts, the memory plan, the engine's latest other line."""
    if not progress:
        return ""
    parts = []
    phase = progress.get("phase")
    if phase == "weights" and progress.get("n_tensors"):
        parts.append(f"{PHASE_TEXT[phase]}: {progress['tensors']}/{progress['n_tensors']} tensors, "
                     f"{size(progress['bytes'])} of {size(progress['n_bytes'])}")
    elif phase in PHASE_TEXT:
        parts.append(PHASE_TEXT[phase])
    if progress.get("memory"):
        parts.append(progress["memory"])
    if progress.get("last_line"):
        parts.append(f"engine: {progress['last_line']}")
    return "\n".join(parts)


def show_on_bar(bar: ProgressBar, progress: dict | None) -> None:
    """Bytes stored out of the model's while the weights go in; an indeterminate bar otherwise."""
    if progress and progress.get("phase") == "weights" and progress.get("n_bytes"):
        bar.update(total=progress["n_bytes"], progress=progress["bytes"])
    else:
        bar.update(total=None)


class LoadBanner(Vertical):
    def __init__(self, origin: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.origin = origin

    def compose(self) -> ComposeResult:
        yield Static("", classes="load-banner-text", markup=False)
        yield ProgressBar(total=None, show_eta=False, classes="load-banner-bar")

    def on_mount(self) -> None:
        self.watch(self.app, "loading", self._refresh, init=False)
        self.watch(self.app, "load_outcome", self._refresh, init=True)
        self.watch(self.app, "status", self._refresh, init=False)  # carries the engine's load progress
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
            status = self.app.status
            progress = status.get("load_progress") if status.get("state") == "loading" else None
            show_on_bar(self.query_one(".load-banner-bar", ProgressBar), progress)
            elapsed = time.monotonic() - loading.started
            text.update(f"Loading {loading.model} (exact concurrency {loading.exact})… {elapsed:.0f} s;"
                        f"{self._attempt_note()} each attempt's log is on the Logs screen (F6)"
                        + (f"\n{describe(progress)}" if progress else ""))
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

