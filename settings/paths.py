"""Where the studio keeps its settings file and its logs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from settings.env import ENV_CONFIG_DIR, ENV_LOG_DIR

APP_NAME = "lockstep"
SETTINGS_FILE = "settings.json"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    override = env.get(ENV_CONFIG_DIR)
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def log_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    override = env.get(ENV_LOG_DIR)
    return Path(override) if override else Path(platformdirs.user_log_dir(APP_NAME))
