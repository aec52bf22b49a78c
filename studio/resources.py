"""Files shipped as package data in `assets/` (stylesheets, the bundled model), found the same way
from a wheel, an editable install or the source tree."""

from __future__ import annotations

from pathlib import Path


def asset(*parts: str) -> Path:
    """A path under the `assets` package (a namespace package: it holds data, no code).

    Not `importlib.resources.files`: on Python 3.11 it fails for a namespace package whose path
    holds an editable install's path-hook entry (not a directory), as a fresh `pip install -e .` makes."""
    import assets

    for base in assets.__path__:
        if Path(base).is_dir():
            return Path(base).joinpath(*parts)
    raise FileNotFoundError(f"no assets folder on {list(assets.__path__)}")
