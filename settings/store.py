"""settings.json on disk: read leniently, written read-modify-write under a lock, never lost.

Reading never writes. What cannot be read is kept: unknown keys and invalid values stay in the file
(the value in use is the default, and the problem is reported), a file that is not JSON is copied
aside before the first save replaces it, and a file that cannot be read or written is left alone.
Every save re-reads the file under a lock and merges into what is on disk, so two studios sharing a
config folder never drop each other's changes; a writer that names the version it saw gets a
conflict when the file changed since.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settings.lenient import read_lenient
from settings.models import Settings
from settings.paths import SETTINGS_FILE, config_dir

log = logging.getLogger("lockstep.settings")
LOCK_WAIT_S = 10.0
NO_FILE = "none"  # the version of a settings file that does not exist


class SettingsError(Exception):
    """A save the store refused; the message says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SettingsConflict(SettingsError):
    """The file changed since the writer read it."""


class SettingsWriteError(SettingsError):
    """The file or its folder cannot be written (read-only, not a file, no permission)."""


@dataclass(frozen=True)
class StoreProblem:
    """Something in the settings file the studio could not use; `kind` is damaged, unreadable or ignored."""

    path: str
    kind: str
    error: str
    at: float
    moved_to: str | None = None

    def message(self) -> str:
        if self.kind == "damaged":
            where = (f"kept as {self.moved_to}" if self.moved_to
                     else f"kept as is; copied to {SETTINGS_FILE}.corrupt-<time> before the next save")
            return f"settings file {self.path} was damaged ({self.error}); {where}, defaults in use"
        if self.kind == "unreadable":
            return f"settings file {self.path} cannot be read ({self.error}); defaults in use, nothing written"
        return f"settings file {self.path}: {self.error}"


def version_of(raw: bytes | None) -> str:
    return NO_FILE if raw is None else hashlib.sha256(raw).hexdigest()[:16]


class SettingsStore:
    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else config_dir()
        self.path = self.directory / SETTINGS_FILE
        self.problems: list[StoreProblem] = []
        self._settings = Settings()
        self._kept: dict[str, Any] = {}  # unknown keys and unusable values, written back as found
        self._damaged: bytes | None = None  # a file that is not a JSON object, to copy aside before a save
        self.version = NO_FILE
        self.refresh()
        for problem in self.problems:
            log.warning(problem.message())

    @property
    def settings(self) -> Settings:
        return self._settings

    def refresh(self) -> Settings:
        """Read the file again (another studio or the TUI may have written it)."""
        raw, problems = self._read_raw()
        self._kept, self._damaged = {}, None
        settings = Settings()
        if raw is not None and not problems:
            try:
                data = json.loads(raw)
                if not isinstance(data, dict):
                    raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                self._damaged = raw
                problems.append(self._problem("damaged", exc))
            else:
                settings, self._kept, notes = read_lenient(data)
                problems += [StoreProblem(str(self.path), "ignored", note, time.time()) for note in notes]
        self._settings, self.problems, self.version = settings, problems, version_of(raw)
        return settings

    def save(self, settings: Settings, expected_version: str | None = None) -> Settings:
        return self.update(Settings.model_validate(settings.model_dump()).model_dump(),
                           expected_version=expected_version)

    def update(self, patch: dict[str, Any], expected_version: str | None = None) -> Settings:
        """Merge `patch` (nested dicts merge, other values replace) into the settings on disk and save.

        Raises pydantic's ValidationError when the result is not valid, SettingsConflict when
        `expected_version` is given and the file changed since, SettingsWriteError when the file
        cannot be written; nothing is written then.
        """
        with self._locked():
            self.refresh()
            unreadable = [p for p in self.problems if p.kind == "unreadable"]
            if unreadable:
                raise SettingsWriteError(f"not saved: {unreadable[0].message()}")
            if expected_version is not None and expected_version != self.version:
                raise SettingsConflict(f"not saved: settings file {self.path} changed since it was read "
                                       "(another studio, the REST API or the TUI wrote it); reload and try again")
            settings = Settings.model_validate(_deep_merge(self._settings.model_dump(), patch))
            self._check_writable()
            if self._damaged is not None:
                self._keep_damaged()
            text = json.dumps(_deep_merge(settings.model_dump(), _without(self._kept, patch)), indent=2) + "\n"
            try:
                atomic_write_text(self.path, text)
            except OSError as exc:
                raise SettingsWriteError(f"not saved: cannot write {self.path}: {exc.strerror or exc}") from exc
            self._settings, self.version = settings, version_of(text.encode())
            self._kept = _without(self._kept, patch)
            self.problems = [p for p in self.problems if p.kind != "damaged" or p.moved_to]
            return settings

    def _read_raw(self) -> tuple[bytes | None, list[StoreProblem]]:
        try:
            return self.path.read_bytes(), []
        except FileNotFoundError:
            return None, []
        except OSError as exc:  # a directory, no permission, a loop of links: report and leave it be
            return b"", [self._problem("unreadable", exc)]

    def _problem(self, kind: str, exc: BaseException, moved_to: str | None = None) -> StoreProblem:
        if isinstance(exc, RecursionError):
            text = "nested too deeply to read"
        elif isinstance(exc, OSError) and exc.strerror:
            text = exc.strerror
        else:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return StoreProblem(str(self.path), kind, text, time.time(), moved_to)

    def _check_writable(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SettingsWriteError(f"not saved: cannot inspect {self.path}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise SettingsWriteError(f"not saved: settings file {self.path} is not a regular file")
        if not st.st_mode & stat.S_IWUSR:
            # A replace would succeed in a writable folder; the user made the file read-only on purpose.
            raise SettingsWriteError(f"not saved: settings file {self.path} is read-only; make it writable to save")

    def _keep_damaged(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{SETTINGS_FILE}.corrupt-{stamp}")
        n = 1
        while target.exists():  # two damaged files within one second must not overwrite each other
            n += 1
            target = self.path.with_name(f"{SETTINGS_FILE}.corrupt-{stamp}-{n}")
        try:
            shutil.copyfile(self.path, target)
        except OSError as exc:
            raise SettingsWriteError(f"not saved: cannot keep the damaged {self.path} aside: {exc}") from exc
        self.problems = [StoreProblem(p.path, p.kind, p.error, p.at, str(target)) if p.kind == "damaged" else p
                         for p in self.problems]
        self._damaged = None
        log.warning(next(p for p in self.problems if p.kind == "damaged").message())

    @contextlib.contextmanager
    def _locked(self):
        """An exclusive lock beside the file (the file itself is replaced, so it cannot hold one)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / f".{SETTINGS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SettingsWriteError(f"not saved: cannot write in {self.directory}: {exc.strerror or exc}") from exc
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SettingsWriteError(f"not saved: {self.path} stayed locked by another "
                                                 f"writer for {LOCK_WAIT_S:g} s") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # closing releases the lock


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


def _without(kept: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`kept` less what `patch` sets (a value the user sets replaces the one that could not be read)."""
    out = {}
    for key, value in kept.items():
        if key not in patch:
            out[key] = value
        elif isinstance(value, dict) and isinstance(patch[key], dict):
            rest = _without(value, patch[key])
            if rest:
                out[key] = rest
    return out
