"""The load manager: one engine child at a time, its state, and what it really granted.

Reported exact state comes from the child that is running: the argv and environment it was started
with, confirmed by its /props `exact_concurrency.granted`. A child that does not report the field
is `unavailable`, never assumed `on`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
)
from settings.env import ENV_EXACT
from settings.precedence import env_value
from studio.catalog import Catalog
from studio.engine_child import EngineChild, stop_process
from studio.errors import StudioError
from studio.launcher import ENGINE_CMD, Launcher, LaunchFailed
from studio.load_plan import plan_load, refuse_before_stopping
from studio.load_progress import read_progress
from studio.loaded import Loaded, LoadState, exit_text, reported_exact
from studio.stats import engine_stats
from studio.studio_log import log_tails, studio_logger

__all__ = ["LoadManager", "exit_text"]  # exit_text: the TUI's chat reads it from here

# Failures the user's settings or machine cause (422), as opposed to the engine breaking (500).
_SETTINGS_FAILURES = {"exact_refusal", "out_of_memory", "no_cuda", "bad_model", "bad_flags"}


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
        self.log, self._studio_log = studio_logger(self.log_dir)
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

    async def load(self, request: LoadRequest) -> dict[str, Any]:
        # prepare scans the catalog (model headers on disk): off the event loop
        model_id, plan, warnings, key = await asyncio.to_thread(
            plan_load, request, self.store.settings, self.catalog, self.env)
        async with self._lock:
            current = self.loaded
            running = current is not None and self.state == "ready" and current.child is not None \
                and current.child.alive
            if running and current.key == key:
                return {**self.load_answer(), "status": "already_loaded"}
            if running:
                refuse_before_stopping(plan, warnings, current.model_id)
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
        return self.loaded.answer(self.state) if self.loaded else {"model": None, "state": self.state}

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
        return log_tails(self.loaded.attempt_dicts if self.loaded else [], self.log_dir, tail_bytes)
