"""The load manager: one engine child at a time, its state, and what it really granted.

Reported exact state comes from the child that is running: the argv and environment it was started
with, confirmed by its /props `exact_concurrency.granted`. A child that does not report the field
is `unavailable`, never assumed `on`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from settings import (
    EXACT_MODES,
    EnvOverrideError,
    LoadRequest,
    Settings,
    SettingsStore,
    apply_env_overrides,
    exact_default,
    log_dir,
    resolve_exact,
    resolve_preempt,
)
from settings.env import ENV_EXACT
from settings.precedence import env_value
from studio.catalog import Catalog, beyond_native
from studio.errors import StudioError
from studio.flags import ExtraArgsError, LoadWarning, exact_contradictions, options_from_settings
from studio.launcher import (
    ENGINE_CMD,
    Attempt,
    EngineChild,
    Launcher,
    LaunchFailed,
    LaunchPlan,
    LaunchResult,
    granted_from_props,
    stop_process,
)
from studio.load_progress import read_progress, tail_text
from studio.stats import engine_stats

# Failures the user's settings or machine cause (422), as opposed to the engine breaking (500).
LoadState = Literal["stopped", "loading", "ready", "failed"]
_SETTINGS_FAILURES = {"exact_refusal", "out_of_memory", "no_cuda", "bad_model", "bad_flags"}
# Load warnings that are certain refusals under exact_concurrency on: known before any child starts.
_EXACT_ON_REFUSALS = {"exact_kv_quantized", "exact_flash_attn_off"}


@dataclass
class Loaded:
    """What is (or was last) loaded, and the answer the load gave."""

    model_id: str
    key: tuple  # settings identity: equal keys answer already_loaded
    plan: LaunchPlan
    warnings: list[LoadWarning]
    result: LaunchResult | None = None
    exact: str = "off"  # on / off / unavailable, as reported
    exact_reason: str | None = None
    respawned: bool = False  # the one automatic respawn after an unexpected exit is spent
    attempts: list[dict[str, Any]] = field(default_factory=list)  # the finished load's attempts
    live: list[Attempt] = field(default_factory=list)  # attempts as they start, while loading

    @property
    def attempt_dicts(self) -> list[dict[str, Any]]:
        return self.attempts or [a.as_dict() for a in self.live]

    @property
    def child(self) -> EngineChild | None:
        return self.result.child if self.result else None


class LoadManager:
    def __init__(
        self,
        store: SettingsStore,
        *,
        catalog: Catalog | None = None,
        env: Mapping[str, str] | None = None,
        logs: Path | None = None,
        engine_cmd: Sequence[str] = ENGINE_CMD,
    ) -> None:
        self.store = store
        self.env = dict(os.environ if env is None else env)
        self.log_dir = Path(logs) if logs is not None else log_dir(self.env)
        self.engine_cmd = tuple(engine_cmd)
        self._fixed_catalog = catalog is not None
        self._catalog = catalog if catalog is not None else Catalog()
        self.state: LoadState = "stopped"
        self.loaded: Loaded | None = None
        self.error: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task | None = None
        self._launching: asyncio.Future | None = None
        self.log, self._studio_log = _studio_logger(self.log_dir)
        for problem in store.problems:
            self.log.warning(problem.message())

    # settings views ------------------------------------------------------------------------------

    def effective_settings(self) -> Settings:
        try:
            settings, _ = apply_env_overrides(self.store.settings, self.env)
        except EnvOverrideError as exc:
            raise StudioError(500, "invalid_environment", str(exc)) from exc
        return settings

    @property
    def catalog(self) -> Catalog:
        if not self._fixed_catalog:
            # Follows the settings so a changed list of folders counts at once; the metadata cache stays.
            self._catalog.folders = [Path(f).expanduser() for f in self.effective_settings().model_folders]
        return self._catalog

    def exact_view(self) -> dict[str, Any]:
        stored = self.store.settings.exact_concurrency
        try:
            env_override = env_value(self.env, ENV_EXACT, EXACT_MODES)
            effective = resolve_exact(None, stored, self.env).value
        except EnvOverrideError as exc:
            raise StudioError(500, "invalid_environment", str(exc)) from exc
        loaded = self.loaded if self.state in ("ready", "loading") else None
        return {
            "exact_concurrency": stored,
            "effective": effective,
            "default": exact_default(self.env),
            "env_override": env_override,
            "active": loaded.exact if loaded and self.state == "ready" else None,
            "reload_required": bool(loaded and loaded.plan.exact_mode != effective),
        }

    # loading -------------------------------------------------------------------------------------

    def prepare(self, request: LoadRequest) -> tuple[str, LaunchPlan, list[LoadWarning], tuple]:
        settings = self.store.settings
        info = self.catalog.find(request.model)
        if info is None:
            raise StudioError(404, "model_not_found",
                              f"model {request.model!r} is neither a catalog id nor a model path")
        load = request.with_defaults(settings.load)
        if problem := beyond_native(request.ctx_size, load.parallel, info.native_context):
            raise StudioError(400, "context_beyond_native", problem)
        if request.ctx_size is None and info.native_context and load.ctx_size > info.native_context:
            # an unasked-for default never runs a model past the positions it was trained on
            load = load.model_copy(update={"ctx_size": info.native_context})
        try:
            exact = resolve_exact(request.exact_concurrency, settings.exact_concurrency, self.env)
            preempt = resolve_preempt(request.preempt_mode, settings.preempt_mode, self.env)
            options = options_from_settings(load)
        except EnvOverrideError as exc:
            raise StudioError(500, "invalid_environment", str(exc)) from exc
        except ExtraArgsError as exc:
            raise StudioError(400, "invalid_extra_args", str(exc)) from exc
        plan = LaunchPlan(info.path, info.id, load.parallel, options, exact.value, preempt.value,
                          info.native_context)
        warnings = exact_contradictions(options) if exact.value != "off" else []
        key = (info.path, load.parallel, tuple(options.items()), exact.value, preempt.value)
        return info.id, plan, warnings, key

    async def load(self, request: LoadRequest) -> dict[str, Any]:
        # prepare scans the catalog (model headers on disk): off the event loop
        model_id, plan, warnings, key = await asyncio.to_thread(self.prepare, request)
        async with self._lock:
            current = self.loaded
            running = current is not None and self.state == "ready" and current.child is not None \
                and current.child.alive
            if running and current.key == key:
                return {**self.load_answer(), "status": "already_loaded"}
            if running:
                _refuse_before_stopping(plan, warnings, current.model_id)
            await self._stop_current()
            self.loaded = Loaded(model_id, key, plan, warnings)
            # A task of its own, so shutdown can cancel a load that is still waiting for health.
            self._launching = asyncio.ensure_future(self._launch(self.loaded))
            try:
                await self._launching
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this request itself is being cancelled
                raise StudioError(503, "load_cancelled",
                                  "the load was cancelled: the studio is shutting down") from None
            except StudioError as exc:
                if running:  # say so: the model that worked is gone
                    exc.message += f"; the previous model {current.model_id} was unloaded"
                    exc.extra["previous_unloaded"] = current.model_id
                    if self.error:
                        self.error["message"] = exc.message
                raise
            finally:
                self._launching = None
            return {**self.load_answer(), "status": "loaded"}

    async def _launch(self, loaded: Loaded) -> None:
        settings = self.store.settings
        self.state, self.error = "loading", None
        self.log.info("loading %s (exact_concurrency=%s, preempt_mode=%s)", loaded.model_id,
                      loaded.plan.exact_mode, loaded.plan.preempt_mode)
        launcher = Launcher(self.log_dir, self.env, self.engine_cmd, health_timeout_s=settings.health_timeout_s,
                            on_attempt=loaded.live.append)
        try:
            result = await launcher.launch(loaded.plan)
        except LaunchFailed as exc:
            loaded.attempts = [a.as_dict() for a in exc.attempts]
            self.state = "failed"
            status = 422 if exc.failure.kind in _SETTINGS_FAILURES else 500
            self.error = {"code": status, "type": exc.failure.kind, "message": exc.message}
            self.log.error("load of %s failed (%s): %s", loaded.model_id, exc.failure.kind, exc.message)
            raise StudioError(status, "load_failed", exc.message, failure=exc.failure.kind,
                              attempts=loaded.attempts, warnings=[w.as_dict() for w in loaded.warnings]) from exc
        except Exception as exc:
            self.state = "failed"
            self.error = {"code": 500, "type": "server_error", "message": f"{type(exc).__name__}: {exc}"}
            self.log.exception("load of %s failed", loaded.model_id)
            raise
        except BaseException:
            self.state = "failed"
            self.error = {"code": 503, "type": "load_cancelled", "message": "the load was cancelled"}
            raise
        loaded.result = result
        loaded.attempts = [a.as_dict() for a in result.attempts]
        loaded.exact, loaded.exact_reason = reported_exact(loaded.plan.exact_mode, result)
        self.state = "ready"
        armed = (f"engine preemption armed: mode={loaded.plan.preempt_mode} "
                 f"exact={'on' if loaded.exact == 'on' else 'off'}")
        self.log.info(armed)
        with open(result.child.log_path, "a", encoding="utf-8") as f:
            f.write(armed + "\n")
        self._watcher = asyncio.ensure_future(self._watch(loaded, result.child))

    async def _watch(self, loaded: Loaded, child: EngineChild) -> None:
        code = await child.process.wait()
        if self.loaded is loaded and loaded.child is child and self.state == "ready":
            self.state = "failed"
            what = exit_text(code)
            self.error = {"code": 503, "type": "engine_exited",
                          "message": f"the engine exited unexpectedly: {what}"}
            self.log.error("engine for %s (pid %s) exited unexpectedly: %s", loaded.model_id,
                           child.process.pid, what)

    async def unload(self) -> dict[str, Any]:
        async with self._lock:
            had = self.loaded is not None and self.state in ("ready", "loading", "failed")
            await self._stop_current()
            self.loaded, self.state, self.error = None, "stopped", None
            return {"status": "unloaded" if had else "not_loaded", "state": self.state}

    async def _stop_current(self) -> None:
        loaded = self.loaded
        if loaded is None or loaded.child is None:
            return
        self.state = "stopped"  # tells the watcher this exit is ours
        if self._watcher:
            self._watcher.cancel()
        await stop_process(loaded.child.process)
        self.log.info("engine for %s stopped", loaded.model_id)

    async def shutdown(self) -> None:
        if self._launching is not None:
            self._launching.cancel()  # the launcher stops the child it was waiting for
            with contextlib.suppress(BaseException):
                await self._launching
        await self.unload()
        self.log.removeHandler(self._studio_log)
        self._studio_log.close()

    async def engine(self) -> EngineChild:
        """The running child for a proxied request; respawns once after an unexpected exit."""
        async with self._lock:
            loaded = self.loaded
            if loaded is None:
                raise StudioError(503, "no_model_loaded", "no model is loaded; POST /api/load first")
            child = loaded.child
            if self.state == "ready" and child is not None and child.alive:
                return child
            if self.state == "loading":
                raise StudioError(503, "model_loading", "the model is still loading")
            if child is None or loaded.respawned:
                message = (self.error or {}).get("message", "the engine is not running")
                raise StudioError(503, "engine_unavailable", f"{message}; load the model again")
            loaded.respawned = True
            self.log.warning("respawning the engine for %s after it exited", loaded.model_id)
            await self._launch(loaded)
            assert loaded.child is not None
            return loaded.child

    # reporting -----------------------------------------------------------------------------------

    def load_answer(self) -> dict[str, Any]:
        loaded = self.loaded
        if loaded is None:
            return {"model": None, "state": self.state}
        child = loaded.child
        return {
            "model": loaded.model_id,
            "model_path": loaded.plan.model_path,
            "state": self.state,
            "exact_concurrency": loaded.exact if child else None,
            "requested_exact_concurrency": loaded.plan.exact_mode,
            "exact_reason": loaded.exact_reason,
            "preempt_mode": loaded.plan.preempt_mode,
            "warnings": [w.as_dict() for w in loaded.warnings],
            "argv": child.argv if child else None,
            "attempts": loaded.attempt_dicts,
            "port": child.port if child else None,
            "pid": child.process.pid if child else None,
        }

    async def status(self) -> dict[str, Any]:
        answer = self.load_answer()
        answer["error"] = self.error
        child = self.loaded.child if self.loaded else None
        stats = await engine_stats(child) if child and child.alive and self.state == "ready" else {}
        answer.update({k: stats.get(k) for k in ("slots", "pages_used", "pages_free", "parks", "restores",
                                                  "recomputes", "tokens_per_second")})
        live = self.loaded.live if self.loaded is not None and self.state == "loading" else []
        # the running attempt's log: a file read, off the event loop
        answer["load_progress"] = await asyncio.to_thread(read_progress, live[-1].log_path) if live else None
        return answer

    def logs(self, tail_bytes: int = 65536) -> dict[str, Any]:
        attempts = []
        for a in self.loaded.attempt_dicts if self.loaded else []:
            attempts.append({**a, "text": tail_text(Path(a["log"]), tail_bytes)})
        studio_log = self.log_dir / "studio.log"
        return {"attempts": attempts, "studio_log": str(studio_log), "studio": tail_text(studio_log, tail_bytes)}


def _refuse_before_stopping(plan: LaunchPlan, warnings: list[LoadWarning], running: str) -> None:
    """A load the engine is certain to refuse never stops the model that is running."""
    if plan.exact_mode != "on":
        return
    for warning in warnings:
        if warning.code in _EXACT_ON_REFUSALS:
            raise StudioError(422, "load_refused", f"exact_concurrency is on, and the engine refuses it with "
                              f"{warning.flag}: {warning.message}. Meet that requirement, or set exact_concurrency "
                              f"to auto or off; {running} is still loaded", failure="exact_refusal",
                              flag=warning.flag, still_loaded=running)


def reported_exact(mode: str, result: LaunchResult) -> tuple[str, str | None]:
    """on / off / unavailable (with the reason) for a load that got a running child."""
    if mode == "off":
        return "off", None
    if not result.child.exact:
        failure = result.exact_dropped
        return "unavailable", failure.line or failure.detail if failure else "the engine was started without it"
    granted, reason = granted_from_props(result.child.props)
    if granted is None:
        return "unavailable", "the engine did not report exact_concurrency.granted in /props"
    if not granted:
        return "unavailable", reason or "the engine did not grant exact concurrency"
    return "on", None


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_instances = itertools.count()


def _studio_logger(directory: Path) -> tuple[logging.Logger, logging.Handler]:
    """A logger writing this manager's studio.log; one per manager so two studios never share a file."""
    directory.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(directory / "studio.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger(f"lockstep.studio.{next(_instances)}")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger, handler
