"""Where the TUI's stylesheets live: the `assets` package data (a wheel, an editable install or the
source tree all find it through importlib.resources)."""

from __future__ import annotations

from pathlib import Path

from studio.resources import asset

STYLE_DIR = asset("tui")


def stylesheet(name: str) -> Path:
    return STYLE_DIR / name
