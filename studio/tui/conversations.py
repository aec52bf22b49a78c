"""Chat conversations kept beside the settings file: one JSON file each, listed newest first.

Written with the settings' atomic replace, so a crash mid-save leaves the previous version.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from settings import atomic_write_text

_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    system: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)  # user/assistant turns, oldest first
    model: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def title(self) -> str:
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "")
        line = " ".join(first.split())
        return (line[:60] + "…") if len(line) > 60 else line or "(empty)"


def to_markdown(conv: Conversation) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.created))
    out = [f"# {conv.title}", "", f"*{when}, model {conv.model or 'unknown'}*", ""]
    if conv.system.strip():
        out += ["## System", "", conv.system, ""]
    for m in conv.messages:
        out += [f"## {'You' if m['role'] == 'user' else 'Assistant'}", "", m["content"], ""]
    return "\n".join(out)


class ConversationStore:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _path(self, conv_id: str) -> Path:
        if not _ID.match(conv_id):
            raise ValueError(f"not a conversation id: {conv_id!r}")
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        conv.updated = time.time()
        atomic_write_text(self._path(conv.id), json.dumps(asdict(conv), ensure_ascii=False, indent=1))

    def load(self, conv_id: str) -> Conversation:
        data: dict[str, Any] = json.loads(self._path(conv_id).read_text(encoding="utf-8"))
        return Conversation(**{k: data[k] for k in Conversation.__dataclass_fields__ if k in data})

    def delete(self, conv_id: str) -> None:
        self._path(conv_id).unlink(missing_ok=True)

    def list(self) -> list[Conversation]:
        """Every readable conversation, newest first; a damaged file is skipped, never deleted."""
        found = []
        for path in self.folder.glob("*.json") if self.folder.is_dir() else []:
            try:
                found.append(self.load(path.stem))
            except (OSError, ValueError, TypeError, KeyError):
                continue
        return sorted(found, key=lambda c: c.updated, reverse=True)

    def export(self, conv: Conversation, path: Path | None = None) -> Path:
        target = Path(path).expanduser() if path else self.folder / f"{conv.id}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(to_markdown(conv), encoding="utf-8")
        return target
