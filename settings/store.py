"""settings.json on disk: atomic writes, and a damaged file kept aside instead of overwritten."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from settings.models import Settings
from settings.paths import SETTINGS_FILE, config_dir

log = logging.getLogger("lockstep.settings")


@dataclass(frozen=True)
class StoreProblem:
    """A settings file that could not be read; it was moved to `moved_to` and defaults used."""

    path: str
    moved_to: str
    error: str
    at: float

    def message(self) -> str:
        return f"settings file {self.path} was damaged ({self.error}); kept as {self.moved_to}, defaults in use"


class SettingsStore:
    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else config_dir()
        self.path = self.directory / SETTINGS_FILE
        self.problems: list[StoreProblem] = []
        self._settings = self._read()

    @property
    def settings(self) -> Settings:
        return self._settings

    def save(self, settings: Settings) -> Settings:
        settings = Settings.model_validate(settings.model_dump())
        atomic_write_text(self.path, settings.model_dump_json(indent=2) + "\n")
        self._settings = settings
        return settings

    def update(self, patch: dict[str, Any]) -> Settings:
        """Merge `patch` (nested dicts merge, other values replace) into the stored settings and save.

        Raises pydantic's ValidationError when the result is not valid; nothing is written then.
        """
        merged = _deep_merge(self._settings.model_dump(), patch)
        return self.save(Settings.model_validate(merged))

    def _read(self) -> Settings:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Settings()
        try:
            return Settings.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            self._set_aside(exc)
            return Settings()

    def _set_aside(self, exc: Exception) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{SETTINGS_FILE}.corrupt-{stamp}")
        n = 1
        while target.exists():  # two damaged files within one second must not overwrite each other
            n += 1
            target = self.path.with_name(f"{SETTINGS_FILE}.corrupt-{stamp}-{n}")
        os.replace(self.path, target)
        error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        problem = StoreProblem(str(self.path), str(target), error, time.time())
        self.problems.append(problem)
        log.warning(problem.message())


def atomic_write_text(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder so a crash leaves the old or the new file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
