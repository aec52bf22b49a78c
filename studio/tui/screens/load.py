"""Load: every load setting as a form, validated on each keystroke with the studio's own checks."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, HorizontalGroup, VerticalScroll
from textual.widgets import Button, Input, Label, Select, Static

from settings import CACHE_TYPES
from studio.catalog import ModelInfo
from studio.tui.format import size
from studio.tui.load_form import DEFAULT, check_load_form, effective_defaults, form_values
from studio.tui.messages import SettingsSaved, settings_saved
from studio.tui.screens.base import StudioScreen, keys
from studio.tui.widgets.load_banner import LoadBanner

# name, label, help; a field's errors replace its help while they last.
TEXT_FIELDS = {
    "ctx_size": ("Context size", "tokens, all slots together; 0 = native context"),
    "parallel": ("Parallel slots", "chats served at once (--parallel)"),
    "batch_size": ("Batch size", "logical batch for prompt processing (-b)"),
    "ubatch_size": ("Micro-batch size", "physical batch (-ub)"),
    "threads": ("CPU threads", "auto = one per physical core (the engine's default), or a number (-t)"),
    "n_gpu_layers": ("GPU layers", "blank = every layer on the GPU (-ngl)"),
    "spec_draft_n_max": ("Draft tokens", "most draft tokens per step (--spec-draft-n-max)"),
    "tp": ("GPUs (--tp)", "tensor parallel; blank = 1"),
    "tensor_split": ("Tensor split", "proportions per GPU, e.g. 3,1 (-ts); blank = even"),
    "extra_args": ("Extra args", "engine flags, e.g. --seed 7"),
}
CHOICES = {
    "exact": ("Exact concurrency", [("default (the stored setting)", DEFAULT), ("auto", "auto"), ("on", "on"),
                                   ("off", "off")],
              "on: refuse to load without it; auto: when possible"),
    "flash_attn": ("Flash attention", [(v, v) for v in ("auto", "on", "off")], "-fa"),
    "cache_type_k": ("KV cache type K", [(v, v) for v in CACHE_TYPES], "-ctk; exact mode needs f32, f16 or bf16"),
    "cache_type_v": ("KV cache type V", [(v, v) for v in CACHE_TYPES], "-ctv"),
    "spec_type": ("Speculative", [("none", "none"), ("n-gram drafts", "ngram")],
                  "with exact on, drafts change speed, never tokens"),
}
ORDER = ("exact", "ctx_size", "parallel", "batch_size", "ubatch_size", "threads", "flash_attn", "n_gpu_layers",
         "cache_type_k", "cache_type_v", "spec_type", "spec_draft_n_max", "tp", "tensor_split", "extra_args")


class LoadScreen(StudioScreen, mode="load", focus="#field-model"):
    BINDINGS = keys(("ctrl+l", "load", "Load"), ("ctrl+s", "save_defaults", "Save as defaults"),
                    ("ctrl+r", "reset", "Reset to defaults"))

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="load-form", classes="-compact-form"):
            with HorizontalGroup(classes="field-row"):
                yield Label("Model", classes="field-label")
                yield Select([], prompt="no models found", id="field-model", compact=True)
                yield Static("", id="help-model", classes="field-help")
            for name in ORDER:
                with HorizontalGroup(classes="field-row"):
                    if name in CHOICES:
                        label, options, help_text = CHOICES[name]
                        yield Label(label, classes="field-label")
                        yield Select(options, allow_blank=False, id=f"field-{name}", compact=True)
                    else:
                        label, help_text = TEXT_FIELDS[name]
                        yield Label(label, classes="field-label")
                        yield Input(id=f"field-{name}", compact=True, classes="-wide" if name == "extra_args" else "")
                    yield Static(help_text, id=f"help-{name}", classes="field-help")
            yield Static("", id="load-exact")
            yield Static("", id="load-warnings")
            with Horizontal(id="load-buttons"):
                yield Button("Load", id="load-button", variant="primary")
                yield Button("Save as defaults", id="save-defaults")
                yield Button("Reset", id="reset-form")
            yield LoadBanner("load", id="load-banner")

    def on_mount(self) -> None:
        self._checked_with: tuple = ()
        self._filled: dict[str, str] = {}  # untouched, the form follows the selected model and the settings
        self._revalidating = False
        self.watch(self.app, "models", self._show_models, init=False)
        self.watch(self.app, "selected_model", self._select_model, init=False)
        self._show_models(self.studio.models)  # fills the form once: the watchers' init would fill it twice more

    # the form's contents -------------------------------------------------------------------------

    def _show_models(self, models: list[ModelInfo] | None) -> None:
        select = self.query_one("#field-model", Select)
        select.set_options([(m.id, m.id) for m in models or []])
        self._select_model(self.studio.selected_model)

    def _select_model(self, model: str | None) -> None:
        select = self.query_one("#field-model", Select)
        if model is not None and any(m.id == model for m in self.studio.models or []):
            select.value = model
        self._refill()

    def on_screen_resume(self) -> None:
        # Settings or the REST API may have changed the stored defaults meanwhile; unchanged, nothing to do.
        settings = self.studio.manager.store.settings
        if (settings.load, settings.exact_concurrency) != self._checked_with:
            self._refill()

    def _refill(self) -> None:
        if self._edited:
            self.revalidate()
        else:
            self.action_reset()

    def _model_info(self) -> ModelInfo | None:
        chosen = self.query_one("#field-model", Select).value
        return next((m for m in self.studio.models or [] if m.id == chosen), None)

    def action_reset(self) -> None:
        self._fill()
        self.revalidate()

    @property
    def _edited(self) -> bool:
        # Compared with what the form was filled with: the Changed events of a fill arrive later.
        now = self.values()
        return any(now.get(name) != value for name, value in self._filled.items())

    def _fill(self) -> None:
        info = self._model_info()
        load = effective_defaults(self.studio.manager.store.settings.load, info.native_context if info else None)
        values = {**form_values(load), "exact": DEFAULT}
        for name, value in values.items():
            self.query_one(f"#field-{name}").value = value
        self._filled = values

    def values(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name in ("model", *ORDER):
            widget = self.query_one(f"#field-{name}")
            value = widget.value
            out[name] = None if value is Select.NULL else str(value)
        return out

    # validation ----------------------------------------------------------------------------------

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self, event: Input.Changed | Select.Changed) -> None:
        if event.control.id == "field-model":
            self._refill()  # another model: its native context, unless the user changed fields already
        elif not self._revalidating:
            # a fill changes every field at once: one check after their Changed events, not one per field
            self._revalidating = True
            self.call_after_refresh(self._revalidate_once)

    def _revalidate_once(self) -> None:
        self._revalidating = False
        self.revalidate()

    def check(self):
        manager = self.studio.manager
        values = self.values()
        info = next((m for m in self.studio.models or [] if m.id == values.get("model")), None)
        return check_load_form(values, defaults=manager.store.settings.load,
                               stored_exact=manager.store.settings.exact_concurrency, env=manager.env,
                               native_context=info.native_context if info else None,
                               size_bytes=info.size_bytes if info else 0)

    def revalidate(self) -> None:
        settings = self.studio.manager.store.settings
        self._checked_with = (settings.load, settings.exact_concurrency)
        result = self.check()
        for name in ("model", *ORDER):
            help_widget = self.query_one(f"#help-{name}", Static)
            error = result.errors.get(name)
            if name == "model":
                default = ""
            elif name in CHOICES:
                default = CHOICES[name][2]
            else:
                default = TEXT_FIELDS[name][1]
            if name == "tp" and result.per_gpu:
                default += f"; weights {size(result.per_gpu)} per GPU"
            help_widget.update(error or default)
            help_widget.set_class(error is not None, "-error")
            self.query_one(f"#field-{name}").set_class(error is not None, "-invalid")
        self.query_one("#load-exact", Static).update(result.exact_text())
        warnings = self.query_one("#load-warnings", Static)
        warnings.update("\n".join(f"⚠ {w}" for w in result.warnings))
        warnings.display = bool(result.warnings)
        self.query_one("#load-button", Button).disabled = not result.ok
        self.query_one("#save-defaults", Button).disabled = not result.ok

    # acting --------------------------------------------------------------------------------------

    @on(Input.Submitted)
    @on(Button.Pressed, "#load-button")
    def action_load(self) -> None:
        result = self.check()
        if not result.ok:
            self.revalidate()
            self.notify("fix the fields marked in red first", severity="error")
            return
        self.studio.start_load(result.request, origin="load")

    @on(Button.Pressed, "#reset-form")
    def _reset_pressed(self) -> None:
        self.action_reset()

    @on(Button.Pressed, "#save-defaults")
    def action_save_defaults(self) -> None:
        result = self.check()
        if not result.ok:
            self.notify("fix the fields marked in red first", severity="error")
            return
        load = result.request.with_defaults(self.studio.manager.store.settings.load)
        self.save_defaults(load.model_dump())

    @work(thread=True, exclusive=True, group="save-load-defaults")
    def save_defaults(self, load: dict) -> None:
        self.post_message(settings_saved(lambda: self.studio.manager.store.update({"load": load})))

    def on_settings_saved(self, message: SettingsSaved) -> None:
        if message.error:
            self.notify(f"not saved: {message.error}", severity="error")
        else:
            self.notify("saved as the default load settings")
