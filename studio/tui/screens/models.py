"""Models: the catalog on the left, the highlighted model's details on the right; Enter loads it."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import DataTable, Static

from settings import LoadRequest
from studio.catalog import ModelInfo, bundled_models_dir
from studio.pull import PullProgress, progress_text
from studio.tui.format import count, size
from studio.tui.load_form import effective_defaults
from studio.tui.screens.base import StudioScreen, keys
from studio.tui.screens.pull import PullScreen
from studio.tui.widgets.load_banner import LoadBanner

COLUMNS = ("model", "format", "arch", "params", "size", "context", "quant mix")


def table_rows(models: list[ModelInfo]) -> list[tuple[str, ...]]:
    return [(m.id, m.format, m.architecture or "?", count(m.parameters), size(m.size_bytes),
             str(m.native_context or "—"), m.quant_mix or "—") for m in models]


def column_widths(rows: list[tuple[str, ...]]) -> list[int]:
    """Each column as wide as its widest cell or label. Set with the rows: DataTable's own sizing waits for
    an idle pass, and a first frame painted before it showed the columns cut to their labels' width."""
    return [max(cell_len(cell) for cell in column) for column in zip(COLUMNS, *rows, strict=False)]


def empty_hint(folders: list[str]) -> Content:
    searched = "\n".join(f"  • {f}" for f in folders) or "  (no folders)"
    return Content.from_markup(
        "[b]No models found.[/b]\n\nLooked in:\n$searched\n\n"
        "The bundled default model goes in [b]assets/models/[/b] (it may not be installed yet). "
        "To use your own, add a folder of GGUF files or Hugging Face model folders on the "
        "[b]Settings[/b] screen (F7), or set [b]LOCKSTEP_MODEL_DIRS[/b], then press [b]r[/b] to rescan.",
        searched=searched,
    )


def details(info: ModelInfo, bundled: bool, loaded: bool) -> Content:
    rows = [
        ("path", info.path),
        ("format", "GGUF file" if info.format == "gguf" else "Hugging Face folder"),
        ("architecture", info.architecture or "unknown"),
        ("parameters", count(info.parameters)),
        ("tensor types", ", ".join(info.tensor_types) or "—"),
        ("size on disk", size(info.size_bytes)),
        ("native context", str(info.native_context) if info.native_context else "—"),
    ]
    tags = []
    if bundled:
        tags.append("[b $accent]bundled default[/]")
    if loaded:
        tags.append("[b $success]loaded[/]")
    head = Content.from_markup("[b]$id[/b]  " + "  ".join(tags), id=info.id)
    body = Content("\n").join(Content.from_markup("[dim]$k[/dim]  $v", k=f"{k:<15}", v=v) for k, v in rows)
    parts = [head, Content(""), body]
    if info.error:
        parts += [Content(""), Content.from_markup("[b $error]Unreadable:[/] $e", e=info.error)]
    parts += [Content(""), Content.from_markup(
        "[b]Enter[/b] or [b]l[/b] loads it with the stored defaults; [b]e[/b] opens the Load form first; "
        "[b]p[/b] pulls another from the Hugging Face Hub.")]
    return Content("\n").join(parts)


class ModelsScreen(StudioScreen, mode="models", focus="#model-table"):
    BINDINGS = [Binding("l", "load_selected", "Load", key_display="⏎/l"),
                *keys(("e", "edit", "Load settings…"), ("r", "rescan", "Rescan"), ("p", "pull", "Pull from Hub…"))]

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="models-body"):
            with Vertical(id="catalog-pane"):
                yield DataTable(id="model-table", cursor_type="row", zebra_stripes=True)
                yield Static("Scanning the model folders…", id="catalog-hint")
            with Vertical(id="details-pane"):
                yield Static("", id="model-details")
                yield Static("", id="pull-banner", markup=False)
                yield LoadBanner("models", id="models-load-banner")

    def on_mount(self) -> None:
        self.query_one("#catalog-pane").border_title = "Models"
        self.query_one("#details-pane").border_title = "Details"
        self.watch(self.app, "models", self._show_models, init=True)
        self.watch(self.app, "status", self._show_details, init=False)
        self.watch(self.app, "pull_progress", self._show_pull, init=True)

    def _show_pull(self, progress: PullProgress | None) -> None:
        banner = self.query_one("#pull-banner", Static)
        banner.set_class(progress is not None, "-active")
        banner.set_class(progress is not None and progress.status == "error", "-failed")
        if progress is None:
            return
        text = progress_text(progress)
        if progress.total and progress.status == "downloading":
            filled = int(30 * progress.completed / progress.total)
            text += f"\n[{'█' * filled}{'░' * (30 - filled)}] {100 * progress.completed / progress.total:.0f}%"
        banner.update(text)

    def _show_models(self, models: list[ModelInfo] | None) -> None:
        table = self.query_one(DataTable)
        hint = self.query_one("#catalog-hint", Static)
        if models is None:
            return
        rows = table_rows(models)
        table.clear(columns=True)
        for label, width in zip(COLUMNS, column_widths(rows), strict=True):
            table.add_column(label, key=label, width=width)
        for m, row in zip(models, rows, strict=True):
            table.add_row(*row, key=m.id)
        self.query_one("#catalog-pane").border_title = f"Models ({len(models)})"
        table.display = bool(models)
        hint.display = not models
        if not models:
            hint.update(empty_hint(self.studio.model_folders))
        selected = self.studio.selected_model
        if selected is not None and models:
            table.move_cursor(row=table.get_row_index(selected))
        self._show_details()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.studio.selected_model = event.row_key.value
            self._show_details()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.studio.selected_model = event.row_key.value
        self.action_load_selected()

    def _selected_info(self) -> ModelInfo | None:
        return next((m for m in self.studio.models or [] if m.id == self.studio.selected_model), None)

    def _show_details(self, _value: object = None) -> None:
        pane = self.query_one("#model-details", Static)
        info = self._selected_info()
        if info is None:
            pane.update("")
            return
        bundled = info.path.startswith(str(bundled_models_dir()))
        status = self.studio.status
        loaded = status.get("model") == info.id and status.get("state") == "ready"
        pane.update(details(info, bundled, loaded))

    def action_load_selected(self) -> None:
        info = self._selected_info()
        if info is None:
            self.notify("no model to load: see the hint on the left", severity="warning")
            return
        load = effective_defaults(self.studio.manager.store.settings.load, info.native_context)
        request = LoadRequest(model=info.id, ctx_size=load.ctx_size, parallel=load.parallel)
        self.studio.start_load(request, origin="models")

    def action_edit(self) -> None:
        self.app.switch_mode("load")

    def action_rescan(self) -> None:
        self.studio.rescan()

    def action_pull(self) -> None:
        def chosen(answer: tuple[str, str | None] | None) -> None:
            if answer is not None:
                self.studio.start_pull(*answer)

        self.app.push_screen(PullScreen(), chosen)
