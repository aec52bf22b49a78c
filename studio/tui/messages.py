"""Messages workers post back to the event loop; only message handlers touch widgets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class LoadOutcome:
    """How a load the user started ended, and which screen started it (errors are shown there)."""

    origin: str
    model: str
    ok: bool
    message: str = ""
    failure: str | None = None  # the classified failure kind, e.g. exact_refusal
    answer: dict[str, Any] | None = None


class LoadFinished(Message):
    def __init__(self, outcome: LoadOutcome) -> None:
        super().__init__()
        self.outcome = outcome


class StatusPolled(Message):
    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__()
        self.status = status


class ApiStarted(Message):
    """The REST API is serving at `url`, or `error` says why it is not."""

    def __init__(self, url: str | None, error: str | None = None) -> None:
        super().__init__()
        self.url = url
        self.error = error


class CatalogScanned(Message):
    def __init__(self, models: list, folders: list[str], error: str | None = None) -> None:
        super().__init__()
        self.models = models
        self.folders = folders
        self.error = error


class ChatDelta(Message):
    def __init__(self, turn: int, text: str, tokens: int = 0, ttft: float | None = None,
                 seconds: float = 0.0) -> None:
        super().__init__()
        self.turn = turn
        self.text = text
        self.tokens = tokens  # so far
        self.ttft = ttft
        self.seconds = seconds


class ChatTrimmed(Message):
    """The oldest `dropped` messages were left out so the conversation fits the context."""

    def __init__(self, turn: int, dropped: int, context: int) -> None:
        super().__init__()
        self.turn = turn
        self.dropped = dropped
        self.context = context


class ChatFinished(Message):
    def __init__(self, turn: int, error: str | None = None, seed: int | None = None, finish_reason: str | None = None,
                 tokens: int = 0, seconds: float = 0.0, ttft: float | None = None, engine_stopped: bool = False
                 ) -> None:
        super().__init__()
        self.turn = turn
        self.error = error
        self.seed = seed
        self.finish_reason = finish_reason
        self.tokens = tokens
        self.seconds = seconds
        self.ttft = ttft
        self.engine_stopped = engine_stopped  # the engine died mid-reply; a reload follows


class EngineReloaded(Message):
    def __init__(self, error: str | None = None) -> None:
        super().__init__()
        self.error = error


class EvidenceProgress(Message):
    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


class EvidenceFinished(Message):
    def __init__(self, report: Any = None, error: str | None = None) -> None:
        super().__init__()
        self.report = report
        self.error = error


class LogsRead(Message):
    def __init__(self, logs: dict[str, Any]) -> None:
        super().__init__()
        self.logs = logs


class SettingsSaved(Message):
    def __init__(self, error: str | None = None) -> None:
        super().__init__()
        self.error = error


class Unloaded(Message):
    def __init__(self, had_model: bool) -> None:
        super().__init__()
        self.had_model = had_model
