"""Export SVG screenshots of the Status and Chat screens for the README, from a real load and chat.

    python scripts/screenshots.py [--model ID] [--out docs/screenshots]   (from the repository root)

Runs the TUI headless at 120x40 with throwaway settings and logs (the user's are not touched),
loads the model (default: the first in the catalog, the bundled one) with exact concurrency on,
asks it to continue a line of Python, then saves status.svg and chat.svg.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from settings import LoadRequest, SettingsStore
from studio.manager import LoadManager
from studio.tui.app import LockstepApp

SIZE = (120, 40)
PROMPT = "def fibonacci(n):"
BUSY_PROMPT = "class Stack:"


async def _until(pilot, predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")
        await pilot.pause(0.1)


async def export(out: Path, model: str | None, max_tokens: int) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="lockstep-shots-") as tmp:
        manager = LoadManager(SettingsStore(Path(tmp) / "config"), logs=Path(tmp) / "logs")
        # The API on its usual port, so the Status shot shows where scripts reach it (or why not).
        app = LockstepApp(manager)
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.models is not None, 60, "the catalog")
            if not app.models:
                raise SystemExit("no models found: install the bundled model or set LOCKSTEP_MODEL_DIRS")
            target = model or app.models[0].id
            app.start_load(LoadRequest(model=target, exact_concurrency="on"), origin="models")
            await _until(pilot, lambda: app.status.get("state") == "ready" and app.loading is None, 300, "the load")
            await pilot.press("4")
            chat = app.screen
            chat.query_one("#opt-temperature").value = "0"
            chat.query_one("#opt-seed").value = "1234"
            chat.query_one("#opt-max-tokens").value = str(max_tokens)
            chat.query_one("#prompt").focus()
            await pilot.press(*PROMPT, "enter")
            await pilot.pause(0.5)
            await _until(pilot, lambda: not chat.streaming, 600, "the reply")
            app.clear_notifications()
            await pilot.pause(0.2)
            shots = [Path(app.save_screenshot("chat.svg", str(out)))]
            # The Status shot is taken while a second reply streams, so a slot is busy and tokens/s moves.
            chat.query_one("#opt-max-tokens").value = str(max_tokens * 3)
            await pilot.press(*BUSY_PROMPT, "enter", "tab", "3")

            def busy() -> bool:
                return any(s.get("is_processing") for s in app.status.get("slots") or [])

            await _until(pilot, busy, 60, "a busy slot")
            await pilot.pause(2.5)  # two more polls: the rate reflects the running reply
            app.clear_notifications()
            shots.append(Path(app.save_screenshot("status.svg", str(out))))
            await _until(pilot, lambda: not chat.streaming, 600, "the second reply")
            if len(chat.conversation) != 4:
                raise RuntimeError("the reply streamed while the Chat screen was not shown did not complete")
        return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="catalog id to load (default: the first, the bundled model)")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for shot in asyncio.run(export(args.out, args.model, args.max_tokens)):
        print(shot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
