"""What a load is doing now, read from the running attempt's log: the engine's latest progress line
(contract.progress), its memory plan and its latest other line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from contract import progress

TAIL_BYTES = 16384  # the engine writes a few lines a second while loading: its latest step is in here


def tail_text(path: Path, n: int) -> str:
    """The last `n` bytes of a file as text; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_progress(log_path: str | Path | None, tail_bytes: int = TAIL_BYTES) -> dict[str, Any] | None:
    """{phase, tensors, n_tensors, bytes, n_bytes, memory, last_line} of a loading engine's log, or
    None before it wrote anything; the counts are 0 outside the weights phase."""
    if not log_path:
        return None
    text = tail_text(Path(log_path), tail_bytes)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]  # not our header
    if not lines:
        return None
    step = progress.latest(text)
    memory = next((ln[ln.index("memory: needs"):] for ln in reversed(lines) if "memory: needs" in ln), None)
    last = lines[-1]
    keep_last = progress.PREFIX not in last and (memory is None or memory not in last)
    return {**(step or progress.LoadStep("")).as_dict(), "phase": step.phase if step else None, "memory": memory,
            "last_line": last[-160:] if keep_last else None}
