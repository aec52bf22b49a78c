"""What is (or was last) loaded, and what the running child reported: its exact state, and how it exited."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any, Literal

from studio.engine_child import EngineChild, granted_from_props
from studio.flags import LoadWarning
from studio.launcher import Attempt, LaunchResult
from studio.load_plan import LaunchPlan

LoadState = Literal["stopped", "loading", "ready", "failed"]


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

    def answer(self, state: str) -> dict[str, Any]:
        """The load's part of /api/load and /api/status."""
        child = self.child
        return {
            "model": self.model_id,
            "model_path": self.plan.model_path,
            "state": state,
            "exact_concurrency": self.exact if child else None,
            "requested_exact_concurrency": self.plan.exact_mode,
            "exact_reason": self.exact_reason,
            "preempt_mode": self.plan.preempt_mode,
            "threads": asked_threads(self.plan.options),
            "threads_in_use": child.props.get("n_threads") if child else None,
            "warnings": [w.as_dict() for w in self.warnings],
            "argv": child.argv if child else None,
            "attempts": self.attempt_dicts,
            "port": child.port if child else None,
            "pid": child.process.pid if child else None,
        }


def asked_threads(options: dict[str, str | None]) -> str:
    """-t as the load asked it: a number, or auto (no -t, or llama-server's -1: the engine's default)."""
    value = options.get("--threads")
    return "auto" if value in (None, "-1") else str(value)


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
