"""Files shipped as package data in `assets/` (stylesheets, the bundled model), found the same way
from a wheel, an editable install or the source tree."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def asset(*parts: str) -> Path:
    """A path under the `assets` package (a namespace package: it holds data, no code)."""
    return Path(str(files("assets").joinpath(*parts)))
