"""Messages workers post back to the event loop; only message handlers touch widgets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from textual.message import Message

from settings import EnvOverrideError, SettingsConflict, SettingsError
from studio.errors import validation_message


@dataclass
class LoadOutcome:
    """How a load the user started ended, and which screen started it (errors are shown there)."""

    origin: str
    model: str
    ok: bool
    message: str = ""
    failure: str | None = None  # the classified failure kind, e.g. exact_refusal
    answer: dict[str, Any] | None = None


@dataclass
class LoadFinished(Message):
    outcome: LoadOutcome


@dataclass
class StatusPolled(Message):
    status: dict[str, Any]


@dataclass
class ApiStarted(Message):
    """The REST API is serving at `url`, or `error` says why it is not."""

    url: str | None
    error: str | None = None


@dataclass
class CatalogScanned(Message):
    models: list
    folders: list[str]
    error: str | None = None


@dataclass
class ChatDelta(Message):
    turn: int
    text: str
    tokens: int = 0  # so far
    ttft: float | None = None
    seconds: float = 0.0


@dataclass
class ChatTrimmed(Message):
    """The oldest `dropped` messages were left out so the conversation fits the context."""

    turn: int
    dropped: int
    context: int


@dataclass
class ChatFinished(Message):
    turn: int
    error: str | None = None
    seed: int | None = None
    finish_reason: str | None = None
    tokens: int = 0
    seconds: float = 0.0
    ttft: float | None = None
    engine_stopped: bool = False  # the engine died mid-reply; a reload follows


@dataclass
class EngineReloaded(Message):
    error: str | None = None


@dataclass
class EvidenceProgress(Message):
    line: str


@dataclass
class EvidenceFinished(Message):
    report: Any = None
    error: str | None = None


@dataclass
class SettingsOnDisk(Message):
    version: str  # of the settings file as it is now (settings.store.version_of)


@dataclass
class LogsRead(Message):
    logs: dict[str, Any]


@dataclass
class SettingsSaved(Message):
    error: str | None = None


def settings_saved(update: Callable[[], object], conflict_hint: str = "") -> SettingsSaved:
    """Runs a settings-store update (in a worker: the store fsyncs) and says how it went. Every refusal is
    an answer, never an exception: one escaping a worker would end the app. `conflict_hint` follows a
    conflict's message: the caller knows how the user gets the current settings back."""
    try:
        update()
    except SettingsConflict as exc:
        return SettingsSaved(exc.message.removeprefix("not saved: ") + conflict_hint)
    except SettingsError as exc:  # an unreadable or unwritable file
        return SettingsSaved(exc.message.removeprefix("not saved: "))
    except ValidationError as exc:
        return SettingsSaved(validation_message(exc))
    except (OSError, EnvOverrideError) as exc:
        return SettingsSaved(str(exc))
    return SettingsSaved()


@dataclass
class Unloaded(Message):
    had_model: bool
