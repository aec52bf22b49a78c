"""Exactness check: the evidence matrix of studio/evidence.py on the loaded model, cell by cell."""

from __future__ import annotations

import asyncio
import re

from textual import on, work
from textual.app import ComposeResult
from textual.containers import HorizontalGroup, VerticalScroll
from textual.content import Content
from textual.widgets import Button, DataTable, ProgressBar, Static

from studio import evidence
from studio.tui.evidence_target import NoTarget, evidence_target
from studio.tui.messages import EvidenceFinished, EvidenceProgress
from studio.tui.screens.base import StudioScreen, keys

# The matrix's cell count today; the bar grows if the harness adds cells.
EXPECTED_CELLS = len(evidence.CELLS)
_CELL_LINE = re.compile(r"^(?P<name>\w+): (?P<result>identical|differs at token (?P<at>\d+))$")

INTRO = (
    "Runs prompt P0 on the loaded model alone, beside neighbours, after a prompt-cache hit, with n=2, "
    "seeded at temperature 0.9, with forced parks, and on engines started with another --parallel, "
    "--ctx-size and -ub, with exact concurrency on, and compares its tokens and logprobs bit for bit. "
    "It starts several engine servers of its own; the loaded one keeps serving."
)


def result_cell(identical: bool, first_diff: int | None, first_token_diff: int | None = None,
                known_ids: bool = False) -> Content:
    """`known_ids`: whether `first_token_diff` was reported, so None there means only logprobs differ."""
    if identical:
        return Content.from_markup("[b $success]✔ identical[/]")
    detail = ""
    if known_ids:
        detail = " (logprob only)" if first_token_diff is None else f" (ids from {first_token_diff})"
    return Content.from_markup("[b $error]✖ differs at token $at[/]$detail", at=str(first_diff), detail=detail)


def loaded_note(status: dict) -> str:
    """What the verdict means for the engine that serves chats: the check never tests that one."""
    exact = status.get("exact_concurrency")
    if status.get("state") != "ready" or exact == "on":
        return ""
    shown = "EXACT OFF" if exact == "off" else "EXACT UNAVAILABLE"
    return (f" The loaded engine runs {shown}: its replies can change with their neighbours; "
            "load with exact concurrency on for that.")


class ExactnessScreen(StudioScreen, mode="exactness"):
    BINDINGS = keys(("r", "run", "Run check"), ("escape", "cancel", "Cancel"))

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="exactness-body"):
            yield Static(INTRO, id="exactness-intro")
            with HorizontalGroup(id="exactness-controls"):
                yield Button("Run check", id="run-check", variant="primary")
                yield Static("", id="exactness-target")
            yield ProgressBar(total=EXPECTED_CELLS, show_eta=False, id="exactness-progress")
            yield Static("", id="exactness-step")
            yield DataTable(id="exactness-cells", cursor_type="row", zebra_stripes=True)
            yield Static("", id="exactness-summary")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("cell", key="cell", width=20)
        table.add_column("result", key="result", width=38)
        table.add_column("condition", key="description")
        self.query_one("#exactness-progress").display = False
        self._checking = False
        self.watch(self.app, "status", self._show_target, init=True)

    def _show_target(self, status: dict) -> None:
        target = self.query_one("#exactness-target", Static)
        if status.get("state") == "ready" and status.get("model"):
            target.update(Content.from_markup("on [b]$m[/b] (loaded)", m=status["model"]))
        else:
            target.update("no model loaded: load one first (F1 Models, Enter)")

    # running -------------------------------------------------------------------------------------

    @on(Button.Pressed, "#run-check")
    def action_run(self) -> None:
        if self._checking:
            self.notify("the check is already running", severity="warning")
            return
        self._checking = True
        table = self.query_one(DataTable)
        table.clear()
        bar = self.query_one("#exactness-progress", ProgressBar)
        bar.update(total=EXPECTED_CELLS, progress=0)
        bar.display = True
        self.query_one("#exactness-step", Static).update("preparing…")
        self._set_summary("", None)
        self.query_one("#run-check", Button).disabled = True
        self.run_check()

    @work(exclusive=True, group="evidence")
    async def run_check(self) -> None:
        manager = self.studio.manager
        try:
            target = await evidence_target(manager)
            self.post_message(EvidenceProgress(f"checking {target.model_id} on {target.device}"))
            report = await evidence.run_matrix(
                target.model_path, vocab=target.vocab, device=target.device, exact=True,
                log_dir=await _evidence_logs(manager.log_dir),
                progress=lambda line: self.post_message(EvidenceProgress(line)))
        except NoTarget as exc:
            self.post_message(EvidenceFinished(error=str(exc)))
        except evidence.EvidenceError as exc:
            self.post_message(EvidenceFinished(error=f"the check could not finish: {exc}"))
        except asyncio.CancelledError:
            self.post_message(EvidenceFinished(error="cancelled; the servers it started were stopped"))
            raise
        except Exception as exc:
            self.post_message(EvidenceFinished(error=f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(EvidenceFinished(report=report))

    def on_evidence_progress(self, message: EvidenceProgress) -> None:
        self.query_one("#exactness-step", Static).update(message.line)
        match = _CELL_LINE.match(message.line)
        if match is None:
            return
        table = self.query_one(DataTable)
        at = match["at"]
        table.add_row(match["name"], result_cell(at is None, int(at) if at else None), "", key=match["name"])
        bar = self.query_one("#exactness-progress", ProgressBar)
        bar.update(total=max(bar.total or 0, table.row_count), progress=table.row_count)

    def on_evidence_finished(self, message: EvidenceFinished) -> None:
        self._checking = False
        self.query_one("#run-check", Button).disabled = False
        self.query_one("#exactness-step", Static).update("")
        if message.error:
            self.query_one("#exactness-progress").display = False
            self._set_summary(message.error, False)
            return
        self.show_report(message.report)

    def show_report(self, report) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for cell in report.cells:
            known = hasattr(cell, "first_token_diff")
            result = result_cell(cell.identical, cell.first_diff, getattr(cell, "first_token_diff", None), known)
            table.add_row(cell.name, result, cell.description, key=cell.name)
        bar = self.query_one("#exactness-progress", ProgressBar)
        bar.update(total=len(report.cells), progress=len(report.cells))
        bar.display = True
        same = sum(c.identical for c in report.cells)
        if report.all_identical:
            text = (f"All {same} cells identical: exact concurrency holds on this model, on the check's own "
                    f"engines started with it on ({report.seconds:.0f} s).")
        else:
            text = (f"{len(report.cells) - same} of {len(report.cells)} cells differ: "
                    "the first differing token is shown per cell.")
        text += loaded_note(self.studio.status)
        self._set_summary(text, report.all_identical)

    def _set_summary(self, text: str, good: bool | None) -> None:
        summary = self.query_one("#exactness-summary", Static)
        summary.update(text)
        summary.set_class(good is True, "-good")
        summary.set_class(good is False, "-bad")

    def action_cancel(self) -> None:
        if self._checking:
            self.workers.cancel_group(self, "evidence")


async def _evidence_logs(log_dir):
    folder = log_dir / "evidence"
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    return folder
