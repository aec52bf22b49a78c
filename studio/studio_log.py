"""The studio's own log (studio.log beside the attempts' logs), and the tails /api/logs answers with."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

from studio.load_progress import tail_text

_instances = itertools.count()


def studio_logger(directory: Path) -> tuple[logging.Logger, logging.Handler]:
    """A logger writing this manager's studio.log; one per manager so two studios never share a file."""
    directory.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(directory / "studio.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger(f"lockstep.studio.{next(_instances)}")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger, handler


def log_tails(attempts: list[dict[str, Any]], directory: Path, tail_bytes: int) -> dict[str, Any]:
    """The end of each attempt's log and of studio.log."""
    studio_log = directory / "studio.log"
    return {"attempts": [{**a, "text": tail_text(Path(a["log"]), tail_bytes)} for a in attempts],
            "studio_log": str(studio_log), "studio": tail_text(studio_log, tail_bytes)}
