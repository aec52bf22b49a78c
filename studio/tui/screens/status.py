"""Status: what the manager reports, refreshed by the app's poll: state, the exact badge, slots, pages."""

from __future__ import annotations

import shlex
import time
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, ProgressBar, Static

from studio.tui.format import number
from studio.tui.screens.base import StudioScreen, keys
from studio.tui.widgets.exact_badge import ExactBadge
from studio.tui.widgets.load_banner import describe, show_on_bar

SLOT_COLUMNS = ("slot", "state", "context", "prompt", "generated", "cached", "parks", "restores")

STATE_TEXT = {
    "ready": "[b $success]● ready[/]",
    "loading": "[b $warning]◌ loading[/]",
    "failed": "[b $error]✖ failed[/]",
    "stopped": "[dim]○ stopped[/]",
}


def exact_reason(status: dict[str, Any]) -> str:
    exact = status.get("exact_concurrency")
    requested = status.get("requested_exact_concurrency")
    if exact == "on":
        return "granted: each chat's tokens and logprobs do not depend on its neighbours, parks or drafts"
    if exact == "unavailable":
        return f"requested ({requested}) but not granted: {status.get('exact_reason') or 'no reason given'}"
    if exact == "off":
        return "not requested: set exact concurrency to auto or on (Load form or Settings)"
    return ""


def engine_rows(status: dict[str, Any]) -> Content:
    state = status.get("state") or "stopped"
    rows = [("model", Content(status.get("model") or "—")),
            ("state", Content.from_markup(STATE_TEXT.get(state, state)))]
    if status.get("model"):
        rows += [
            ("exact requested", Content(str(status.get("requested_exact_concurrency") or "—"))),
            ("preempt mode", Content(str(status.get("preempt_mode") or "—"))),
            ("CPU threads", Content(threads_text(status))),
            ("engine", Content(f"pid {status['pid']} on port {status['port']}" if status.get("pid") else "—")),
            ("attempts", Content(str(len(status.get("attempts") or [])))),
        ]
    return Content("\n").join(Content.from_markup("[dim]$k[/dim]  ", k=f"{k:<16}") + v for k, v in rows)


def threads_text(status: dict[str, Any]) -> str:
    asked, used = status.get("threads"), status.get("threads_in_use")
    if used is None:
        return f"{asked or '—'} (not reported yet)"
    return f"{used} (auto: the engine's default)" if asked == "auto" else f"{used} (set to {asked})"


def slot_row(slot: dict[str, Any]) -> tuple[str, ...]:
    if slot.get("is_preempted"):
        state = "parked"
    elif slot.get("is_processing"):
        state = "busy"
    else:
        state = "idle"
    return (str(slot.get("id", "?")), state, number(slot.get("n_ctx")), number(slot.get("prompt_tokens")),
            number(slot.get("generated")), number(slot.get("cached_tokens")), number(slot.get("n_preempt")),
            number(slot.get("n_restore")))


def live_rate(before: tuple[float, dict[Any, int]] | None, now: tuple[float, dict[Any, int]]) -> float | None:
    """Tokens/s generated between two polls by the requests running in both ({task id: generated})."""
    if before is None or now[0] <= before[0]:
        return None
    common = before[1].keys() & now[1].keys()
    if not common:
        return None
    return sum(max(0, now[1][t] - before[1][t]) for t in common) / (now[0] - before[0])


def running(slots: list[dict[str, Any]] | None) -> dict[Any, int]:
    """{request: tokens generated so far} of the busy slots; a request is its task id (else its slot)."""
    return {s.get("task", ("slot", s.get("id"))): int(s.get("generated") or 0)
            for s in slots or [] if s.get("is_processing")}


def rate_text(status: dict[str, Any], live: float | None) -> str:
    """The rate of what runs now; the engine's figure (finished requests) only when nothing runs."""
    if running(status.get("slots")):
        return f"generating {number(live, 1)} tokens/s" if live is not None else "generating…"
    last = status.get("tokens_per_second")
    return f"idle (last requests {number(last, 1)} tokens/s)" if last else "idle"


class StatusScreen(StudioScreen, mode="status"):
    BINDINGS = keys(("c", "app.goto('chat')", "Chat"), ("x", "app.goto('exactness')", "Check exactness"),
                    ("u", "app.unload", "Unload"), ("r", "app.refresh_status", "Refresh"))

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="status-body"):
            with Horizontal(id="status-top"):
                yield Static("", id="engine-info")
                with Vertical(id="badge-box"):
                    yield ExactBadge(id="exact-badge")
                    yield Static("", id="exact-reason")
            yield Static("", id="status-error")
            yield ProgressBar(total=None, show_eta=False, id="status-loading")
            yield Static("", id="status-load-progress", markup=False)
            with Horizontal(id="figures"):
                yield Static("", id="pages-label")
                yield ProgressBar(total=1, show_eta=False, id="pages-bar")
                yield Static("", id="counters")
            yield DataTable(id="slots-table", cursor_type="none", zebra_stripes=True)
            yield Static("", id="status-warnings")
            yield Static("", id="status-argv")
            yield Static("", id="api-note")

    def on_mount(self) -> None:
        self._last_sample: tuple[float, dict[Any, int]] | None = None
        self.query_one("#engine-info").border_title = "Engine"
        table = self.query_one("#slots-table", DataTable)
        for column in SLOT_COLUMNS:
            table.add_column(column, key=column)
        self.watch(self.app, "status", self.show_status, init=True)
        self.watch(self.app, "loading", lambda _v: self.show_status(self.studio.status), init=False)
        self.watch(self.app, "api_note", self._show_api_note, init=True)

    def _show_api_note(self, note: str) -> None:
        self.query_one("#api-note", Static).update(Content.from_markup("[dim]$note[/dim]", note=note))

    def show_status(self, status: dict[str, Any]) -> None:
        state = status.get("state") or "stopped"
        loading = self.studio.loading is not None or state == "loading"
        badge = self.query_one(ExactBadge)
        if loading:
            badge.state = "loading"
        elif state == "ready":
            badge.state = status.get("exact_concurrency") or "unavailable"
        else:
            badge.state = state if status.get("model") else "none"
        self.query_one("#engine-info", Static).update(engine_rows(status))
        self.query_one("#exact-reason", Static).update(exact_reason(status) if state == "ready" else "")
        self.query_one("#status-loading", ProgressBar).display = loading
        progress = status.get("load_progress") if state == "loading" else None
        show_on_bar(self.query_one("#status-loading", ProgressBar), progress)
        self.query_one("#status-load-progress", Static).update(describe(progress))
        self.query_one("#status-load-progress").display = bool(progress)

        error = self.query_one("#status-error", Static)
        err = status.get("error")
        error.display = True
        error.set_class(bool(err), "-error")
        if err:
            error.update(Content.from_markup("[b]$type[/b]: $message", type=err.get("type", "error"),
                                             message=err.get("message", "")))
        elif not status.get("model") and not loading:
            error.update(Content.from_markup(
                "No model is loaded. Press [b]F1[/b] for Models, pick one, and press [b]Enter[/b]."))
        else:
            error.display = False

        ready = state == "ready"
        self.query_one("#figures").display = ready
        used, free = status.get("pages_used"), status.get("pages_free")
        bar = self.query_one("#pages-bar", ProgressBar)
        if used is not None and free is not None:
            bar.update(total=max(used + free, 1), progress=used)
            pages = f"KV pages {number(used)} / {number(used + free)}"
        else:
            pages = "KV pages —"
        self.query_one("#pages-label", Static).update(pages)
        sample = (time.monotonic(), running(status.get("slots")))
        live = live_rate(self._last_sample, sample)
        self._last_sample = sample
        self.query_one("#counters", Static).update(
            f"parks {number(status.get('parks'))}   restores {number(status.get('restores'))}   "
            f"{rate_text(status, live)}")

        table = self.query_one("#slots-table", DataTable)
        table.clear()
        for slot in status.get("slots") or [] if ready else []:
            table.add_row(*slot_row(slot))
        table.display = ready and bool(status.get("slots"))

        warnings = status.get("warnings") or []
        self.query_one("#status-warnings", Static).update(
            "\n".join(f"⚠ {w.get('message', w)}" for w in warnings))
        self.query_one("#status-warnings").display = bool(warnings)
        argv = status.get("argv")
        self.query_one("#status-argv", Static).update(
            Content.from_markup("[dim]engine argv[/dim]  $argv", argv=shlex.join(argv)) if argv else "")
