"""Which exact-concurrency and preemption mode a load gets, and why.

Highest first: the studio's environment variable, the load request, the stored setting, an
inherited engine variable (exact only: `LOCKSTEP_EXACT=1` read as on), the built-in default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from contract.env import switch
from settings.env import ENV_EXACT, ENV_EXACT_INHERITED, ENV_PREEMPT, EnvOverrideError
from settings.models import DEFAULT_EXACT, DEFAULT_PREEMPT, EXACT_MODES, PREEMPT_MODES

Source = Literal["env", "request", "store", "inherited", "default"]


@dataclass(frozen=True)
class Resolved:
    value: str
    source: Source


def env_value(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    """The variable's value, None when unset or empty; a value outside `allowed` is an error."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value not in allowed:
        raise EnvOverrideError(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return value


def inherited_exact(env: Mapping[str, str]) -> bool:
    """Read as the engine reads it (contract.env.parse_switch); a value it would refuse is an error here too."""
    try:
        return switch(env, ENV_EXACT_INHERITED)
    except ValueError as e:
        raise EnvOverrideError(str(e)) from e


def _first(levels: list[tuple[str | None, Source]], default: str) -> Resolved:
    for value, source in levels:
        if value is not None:
            return Resolved(value, source)
    return Resolved(default, "default")


def resolve_exact(request: str | None, stored: str | None, env: Mapping[str, str] | None = None) -> Resolved:
    env = os.environ if env is None else env
    return _first(
        [
            (env_value(env, ENV_EXACT, EXACT_MODES), "env"),
            (request, "request"),
            (stored, "store"),
            ("on" if inherited_exact(env) else None, "inherited"),
        ],
        DEFAULT_EXACT,
    )


def resolve_preempt(request: str | None, stored: str | None, env: Mapping[str, str] | None = None) -> Resolved:
    env = os.environ if env is None else env
    return _first(
        [(env_value(env, ENV_PREEMPT, PREEMPT_MODES), "env"), (request, "request"), (stored, "store")],
        DEFAULT_PREEMPT,
    )


def exact_default(env: Mapping[str, str] | None = None) -> str:
    """What applies when neither the environment override, a request nor the store says anything."""
    env = os.environ if env is None else env
    return "on" if inherited_exact(env) else DEFAULT_EXACT
