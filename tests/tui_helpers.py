"""Waiting on a Pilot-driven app: the TUI tests and scripts/screenshots.py poll the same way."""

from __future__ import annotations

import time


async def until(pilot, predicate, timeout: float, what: str) -> None:
    """Polls `predicate` between Pilot pauses; an AssertionError naming `what` past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await pilot.pause(0.05)
