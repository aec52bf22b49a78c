"""The Lockstep studio TUI: the screens over one LoadManager, with the REST API in the same event loop.

Scripts calling the API and the person at the keyboard drive the same manager, so a model loaded by
either shows up in both. Work that waits (loads, polls, streams, the evidence run, file reads) runs
in workers that post messages; only message handlers and watchers touch widgets.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import var
from textual.screen import Screen
from textual.worker import Worker

from settings import EnvOverrideError, LoadRequest, SettingsStore, log_dir, resolve_exact
from studio.catalog import ModelInfo, bundled_models_dir
from studio.errors import StudioError
from studio.manager import LoadManager
from studio.pull import PullProgress, pull
from studio.pull_api import target_folder
from studio.tui.api_server import ApiServer
from studio.tui.messages import ApiStarted, CatalogScanned, LoadFinished, LoadOutcome, StatusPolled, Unloaded
from studio.tui.navigation import PLACES, Place
from studio.tui.prebuild import Prebuilder, thaw
from studio.tui.screens import SCREENS
from studio.tui.screens.quit import QuitScreen
from studio.tui.stylesheets import STYLE_DIR

POLL_INTERVAL_S = 1.0
NARROW_BELOW = 110  # columns: below this the nav bar takes two lines so the loaded model stays in view
NAV = Binding.Group("Screens", compact=True)


@dataclass(frozen=True)
class LoadProgress:
    origin: str
    model: str
    exact: str
    started: float


def nav_binding(place: Place) -> Binding:
    # Shown by the nav bar, not the footer; priority so a focused text field cannot keep them.
    keys, label = place.bindings()
    return Binding(keys, f"goto('{place.mode}')", place.title, key_display=label, group=NAV, tooltip=place.help,
                   show=False, priority=True)


def instance_log_dir() -> Path:
    """This studio's own folder under the log folder, so two studios never show each other's logs."""
    return log_dir() / f"studio-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def order_models(models: Iterable[ModelInfo]) -> list[ModelInfo]:
    """The bundled default model first: it is what a new user loads."""
    bundled = str(bundled_models_dir())
    return sorted(models, key=lambda m: not m.path.startswith(bundled))


class LockstepApp(App[int]):
    TITLE = "Lockstep"
    CSS_PATH = sorted(STYLE_DIR.glob("*.tcss"))
    MODES = {place.mode: SCREENS[place.mode] for place in PLACES}
    DEFAULT_MODE = "models"
    BINDINGS = [
        *(nav_binding(p) for p in PLACES),
        Binding("q", "ask_quit", "Quit"),
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]

    status: var[dict[str, Any]] = var(dict)
    loading: var[LoadProgress | None] = var(None)
    load_outcome: var[LoadOutcome | None] = var(None)
    models: var[list[ModelInfo] | None] = var(None)  # None until the first scan
    model_folders: var[list[str]] = var(list)
    selected_model: var[str | None] = var(None)
    api_note: var[str] = var("")
    pull_progress: var[PullProgress | None] = var(None)  # the running or last Hub pull

    def __init__(self, manager: LoadManager | None = None, *, api: bool = True, api_host: str | None = None,
                 api_port: int | None = None, poll_interval: float = POLL_INTERVAL_S) -> None:
        super().__init__()
        self.manager = manager if manager is not None else LoadManager(SettingsStore(), logs=instance_log_dir())
        self._want_api = api
        self._api_host, self._api_port = api_host, api_port
        self._poll_interval = poll_interval
        self.api: ApiServer | None = None
        self.css_refreshed_at: int | None = None  # the style stamp the stylesheet was last parsed at
        self._poll_worker: Worker | None = None
        self._load_worker: Worker | None = None
        self.prebuilder = Prebuilder(self)
        self._to_built_screen = False
        self.prebuild_worker: Worker | None = None
        # Saved chats live beside the settings file.
        self.conversations_dir = Path(self.manager.store.path).parent / "conversations"

    # lifecycle -----------------------------------------------------------------------------------

    def refresh_css(self, animate: bool = True) -> None:
        super().refresh_css(animate)
        self.css_refreshed_at = self._css_update_count  # see StudioScreen.__init__

    def on_mount(self) -> None:
        if self._want_api:
            self.start_api()
        else:
            self.api_note = "REST API off (started without it)"
        self.rescan()
        self.poll_status()
        self.set_interval(self._poll_interval, self.poll_status)
        self.call_after_refresh(self.prebuild_screens)
        for problem in getattr(self.manager.store, "problems", []):
            self.notify(problem.message(), title="Settings file", severity="warning", timeout=15)

    def prebuild_screens(self) -> None:
        """Every other screen built off screen while the user reads this one: first visits then only paint."""
        self.prebuild_worker = self.run_worker(self.prebuilder.run([p.mode for p in PLACES]), group="prebuild")

    async def _shutdown(self) -> None:
        # Textual's shutdown (quitting, and the end of a Pilot test alike) closes the screens it has: the
        # prebuild stops first, so none is left half mounted.
        await self.prebuilder.stop()
        await super()._shutdown()

    async def on_unmount(self) -> None:
        # Our own requests (a streaming reply, a pull) end first, so the engine has none left to finish;
        # then the engine and the API together: proxied requests end at once instead of holding its shutdown.
        self.workers.cancel_all()
        thaw()
        await asyncio.gather(self.manager.shutdown(), self.api.stop() if self.api is not None else asyncio.sleep(0))

    def action_ask_quit(self) -> None:
        model = self.manager.loaded.model_id if self.manager.loaded is not None else None
        if model is None or self.manager.state not in ("ready", "loading"):
            self.exit()
            return
        self.push_screen(QuitScreen(model))

    # the REST API --------------------------------------------------------------------------------

    @work(group="api")
    async def start_api(self) -> None:
        try:
            api = self.manager.effective_settings().api
        except EnvOverrideError as exc:
            self.post_message(ApiStarted(None, f"REST API off: {exc}"))
            return
        server = ApiServer(self.manager, self._api_host or api.host, self._api_port or api.port, api.api_key)
        try:
            url = await server.start()
        except OSError as exc:
            why = "the port is in use (another lockstep?)" if exc.errno in (48, 98, 10048) else exc.strerror or exc
            self.post_message(ApiStarted(None, f"REST API off: cannot listen on {server.url}: {why}"))
            return
        self.api = server
        self.post_message(ApiStarted(url))

    def on_api_started(self, message: ApiStarted) -> None:
        if message.url:
            self.api_note = f"REST API and /v1 proxy on {message.url}"
        else:
            self.api_note = message.error or "REST API off"
            self.notify(f"{self.api_note}. The TUI works without it.", severity="warning", timeout=10)

    # the catalog ---------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="scan")
    def rescan(self) -> None:
        # Reading model headers touches the disk: off the event loop.
        catalog = self.manager.catalog
        folders = [str(f) for f in catalog.roots()]
        try:
            models = order_models(catalog.scan())
        except Exception as exc:  # a broken folder must not take the TUI down
            self.post_message(CatalogScanned([], folders, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(CatalogScanned(models, folders))

    def on_catalog_scanned(self, message: CatalogScanned) -> None:
        if message.error:
            self.notify(f"model scan failed: {message.error}", severity="error")
        self.model_folders = message.folders
        self.models = message.models
        ids = [m.id for m in message.models]
        if self.selected_model not in ids:
            self.selected_model = ids[0] if ids else None

    # status --------------------------------------------------------------------------------------

    def poll_status(self) -> None:
        # A slow engine must not pile up polls; the next tick tries again.
        if self._poll_worker is None or self._poll_worker.is_finished:
            self._poll_worker = self.run_worker(self._poll(), group="poll")

    async def _poll(self) -> None:
        try:
            status = await self.manager.status()
        except Exception as exc:
            status = {"state": "failed", "error": {"type": "status_failed", "message": str(exc)}}
        self.post_message(StatusPolled(status))

    def on_status_polled(self, message: StatusPolled) -> None:
        self.status = message.status

    # loading -------------------------------------------------------------------------------------

    def start_load(self, request: LoadRequest, origin: str) -> bool:
        """Start loading; False (and a notice) when a load is already running."""
        if self.loading is not None:
            self.notify(f"{self.loading.model} is still loading", severity="warning")
            return False
        try:
            exact = resolve_exact(request.exact_concurrency, self.manager.store.settings.exact_concurrency,
                                  self.manager.env).value
        except EnvOverrideError as exc:
            self.load_outcome = LoadOutcome(origin, request.model, False, str(exc), "invalid_environment")
            return False
        self.load_outcome = None
        self.loading = LoadProgress(origin, request.model, exact, time.monotonic())
        self._load_worker = self.run_worker(self._load(request, origin), group="load")
        self.poll_status()
        return True

    async def _load(self, request: LoadRequest, origin: str) -> None:
        try:
            answer = await self.manager.load(request)
        except StudioError as exc:
            failure = exc.extra.get("failure") or exc.type
            outcome = LoadOutcome(origin, request.model, False, exc.message, failure)
        except Exception as exc:
            outcome = LoadOutcome(origin, request.model, False, f"{type(exc).__name__}: {exc}", "crash")
        else:
            outcome = LoadOutcome(origin, answer.get("model") or request.model, True, answer=answer)
        self.post_message(LoadFinished(outcome))

    def on_load_finished(self, message: LoadFinished) -> None:
        outcome = message.outcome
        self.loading = None
        self.load_outcome = outcome
        self.poll_status()
        if outcome.ok:
            answer = outcome.answer or {}
            exact = answer.get("exact_concurrency")
            note = "already loaded" if answer.get("status") == "already_loaded" else "loaded"
            self.notify(f"{outcome.model} {note}: exact concurrency {exact}. Press c to chat.", timeout=6)
            self.switch_mode("status")

    # pulling from the Hub ---------------------------------------------------------------------

    def start_pull(self, repo: str, file: str | None) -> None:
        progress = self.pull_progress
        if progress is not None and progress.status in ("listing", "downloading"):
            self.notify(f"{progress.repo} is still being pulled", severity="warning")
            return
        self.pull_progress = PullProgress(repo)
        self.run_worker(self._pull(repo, file), group="pull", exclusive=True)

    async def _pull(self, repo: str, file: str | None) -> None:
        def report(p: PullProgress) -> None:
            self.pull_progress = p

        try:
            folder = await asyncio.to_thread(target_folder, self.manager)
            await pull(repo, file, folder, report)
        except StudioError as exc:
            self.pull_progress = PullProgress(repo, status="error", error=exc.message)
        except Exception as exc:
            self.pull_progress = PullProgress(repo, status="error", error=f"{type(exc).__name__}: {exc}")
        else:
            self.rescan()

    @work(group="load")
    async def unload(self) -> None:
        if self.loading is not None:
            self.notify("wait for the load to finish before unloading", severity="warning")
            return
        answer = await self.manager.unload()
        self.post_message(Unloaded(answer.get("status") == "unloaded"))

    def on_unloaded(self, message: Unloaded) -> None:
        self.load_outcome = None
        self.poll_status()
        self.notify("engine stopped" if message.had_model else "no model was loaded")

    # navigation ----------------------------------------------------------------------------------

    def switch_mode(self, mode: str):
        self._to_built_screen = mode in self._screen_stacks
        try:
            return super().switch_mode(mode)
        finally:
            self._to_built_screen = False

    def delay_update(self, delay: float = 0.05) -> None:
        # switch_mode holds every frame for 50 ms to hide a screen being built; a built one has nothing to
        # hide (1 ms, not 0: a zero-delay timer never ended the hold).
        super().delay_update(0.001 if self._to_built_screen else delay)

    def action_goto(self, mode: str) -> None:
        self.switch_mode(mode)

    def action_refresh_status(self) -> None:
        self.poll_status()

    def action_unload(self) -> None:
        self.unload()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for place in PLACES:
            yield SystemCommand(f"Go to {place.title}", place.help, lambda m=place.mode: self.switch_mode(m))
        yield SystemCommand("Rescan models", "look for models in the model folders again", self.rescan)
        yield SystemCommand("Unload the model", "stop the engine and free its memory", self.unload)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockstep", description="Lockstep studio terminal UI")
    parser.add_argument("--no-api", action="store_true", help="do not serve the REST API beside the UI")
    parser.add_argument("--api-host", help="address for the REST API (default: the api.host setting)")
    parser.add_argument("--api-port", type=int, help="port for the REST API (default: the api.port setting)")
    return parser


def run_tui(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv if argv is not None else [])
    app = LockstepApp(api=not args.no_api, api_host=args.api_host, api_port=args.api_port)
    result = app.run()
    return int(result) if isinstance(result, int) else 0
