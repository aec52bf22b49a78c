"""Environment variables the studio reads, and the overrides they apply to stored settings.

Overrides change what the running studio uses, never what is written to disk: a PUT of the
settings stores the user's values even while an environment variable outranks them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from contract import env as names
from settings.models import Settings

# The names live in contract.env's registry; these are the studio-side aliases.
ENV_EXACT = names.EXACT_CONCURRENCY
# The engine's own switch; when the studio itself inherited it, it is read as a weak "on".
ENV_EXACT_INHERITED = names.EXACT
ENV_PREEMPT = names.PREEMPT_MODE
ENV_CONFIG_DIR = names.CONFIG_DIR
ENV_LOG_DIR = names.LOG_DIR
ENV_API_HOST = names.API_HOST
ENV_API_PORT = names.API_PORT
ENV_API_KEY = names.API_KEY
# Extra model folders, os.pathsep separated, scanned in addition to the stored ones.
ENV_MODEL_DIRS = names.MODEL_DIRS


class EnvOverrideError(ValueError):
    """An environment variable holds a value the studio cannot use."""


def apply_env_overrides(settings: Settings, env: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """Return the settings with environment overrides applied, and the names of those applied.

    `exact_concurrency` and `preempt_mode` are not folded in here: their environment variables
    outrank even a load request, so `settings.precedence` resolves them at load time.
    """
    env = os.environ if env is None else env
    data = settings.model_dump()
    applied: list[str] = []
    if env.get(ENV_API_HOST):
        data["api"]["host"] = env[ENV_API_HOST]
        applied.append(ENV_API_HOST)
    if env.get(ENV_API_PORT):
        try:
            data["api"]["port"] = int(env[ENV_API_PORT])
        except ValueError as exc:
            raise EnvOverrideError(f"{ENV_API_PORT}={env[ENV_API_PORT]!r} is not a port number") from exc
        applied.append(ENV_API_PORT)
    if env.get(ENV_API_KEY):
        data["api"]["api_key"] = env[ENV_API_KEY]
        applied.append(ENV_API_KEY)
    if env.get(ENV_MODEL_DIRS):
        extra = [p for p in env[ENV_MODEL_DIRS].split(os.pathsep) if p]
        data["model_folders"] = data["model_folders"] + [p for p in extra if p not in data["model_folders"]]
        applied.append(ENV_MODEL_DIRS)
    try:
        return Settings.model_validate(data), applied
    except ValueError as exc:
        raise EnvOverrideError(f"environment overrides {', '.join(applied)} are invalid: {exc}") from exc
