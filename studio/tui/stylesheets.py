"""Where the TUI's stylesheets live: assets/tui beside the studio package (source tree or editable install)."""

from __future__ import annotations

from pathlib import Path

STYLE_DIR = Path(__file__).resolve().parents[2] / "assets" / "tui"


def stylesheet(name: str) -> Path:
    return STYLE_DIR / name
