"""Studio settings: pydantic models, the JSON store, environment overrides and precedence rules.

Must not import studio or engine.
"""

from settings.env import (
    ENV_EXACT,
    ENV_EXACT_INHERITED,
    ENV_PREEMPT,
    EnvOverrideError,
    apply_env_overrides,
)
from settings.models import (
    CACHE_TYPES,
    EXACT_CACHE_TYPES,
    EXACT_MODES,
    PREEMPT_MODES,
    TENSOR_SPLIT,
    ApiSettings,
    ExactMode,
    LoadDefaults,
    LoadRequest,
    PreemptMode,
    Settings,
    threads_value,
)
from settings.paths import config_dir, log_dir
from settings.precedence import Resolved, exact_default, resolve_exact, resolve_preempt
from settings.store import (
    SettingsConflict,
    SettingsError,
    SettingsStore,
    SettingsWriteError,
    StoreProblem,
    atomic_write_text,
)

__all__ = [
    "CACHE_TYPES",
    "ENV_EXACT",
    "ENV_EXACT_INHERITED",
    "ENV_PREEMPT",
    "EXACT_CACHE_TYPES",
    "EXACT_MODES",
    "PREEMPT_MODES",
    "TENSOR_SPLIT",
    "ApiSettings",
    "EnvOverrideError",
    "ExactMode",
    "LoadDefaults",
    "LoadRequest",
    "PreemptMode",
    "Resolved",
    "Settings",
    "SettingsConflict",
    "SettingsError",
    "SettingsStore",
    "SettingsWriteError",
    "StoreProblem",
    "apply_env_overrides",
    "atomic_write_text",
    "config_dir",
    "exact_default",
    "log_dir",
    "resolve_exact",
    "resolve_preempt",
    "threads_value",
]
