"""Export SVG screenshots of the Models, Chat and Status screens for the README, from real work.

    python scripts/screenshots.py [--model ID] [--out docs/screenshots]   (from the repository root)

Runs the TUI headless at 120x40 with throwaway settings and logs (the user's are not touched).
models.svg: a pull in progress, from a local server in the Hub's layout (tests/hub_server.py, this
machine has no internet) serving the bundled model, held half way. Then it loads the model (default:
the first in the catalog, the bundled one) with exact concurrency on, asks it to continue a line of
Python under a system prompt (chat.svg), and takes status.svg while a second reply streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from settings import LoadRequest, SettingsStore  # noqa: E402
from studio.catalog import bundled_models_dir  # noqa: E402
from studio.manager import LoadManager  # noqa: E402
from studio.tui.app import LockstepApp  # noqa: E402
from tests.hub_server import Hub  # noqa: E402
from tests.tui_helpers import until  # noqa: E402

SIZE = (120, 40)
SYSTEM = "You complete Python code."
PROMPT = "def fibonacci(n):"
BUSY_PROMPT = "class Stack:"


async def export(out: Path, model: str | None, max_tokens: int) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="lockstep-shots-") as tmp:
        manager = LoadManager(SettingsStore(Path(tmp) / "config"), logs=Path(tmp) / "logs")
        # The API on its usual port, so the Status shot shows where scripts reach it (or why not).
        app = LockstepApp(manager)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.models is not None, 60, "the catalog")
            if not app.models:
                raise SystemExit("no models found: install the bundled model or set LOCKSTEP_MODEL_DIRS")
            target = model or app.models[0].id
            shots = [await _pull_shot(app, pilot, out, Path(tmp))]
            app.start_load(LoadRequest(model=target, exact_concurrency="on"), origin="models")
            await until(pilot, lambda: app.status.get("state") == "ready" and app.loading is None, 300, "the load")
            await pilot.press("f4")
            chat = app.screen
            chat.query_one("#system").value = SYSTEM
            chat.query_one("#opt-temperature").value = "0"
            chat.query_one("#opt-seed").value = "1234"
            chat.query_one("#opt-max-tokens").value = str(max_tokens)
            chat.query_one("#prompt").focus()
            await pilot.press(*PROMPT, "enter")
            await pilot.pause(0.5)
            await until(pilot, lambda: not chat.streaming, 600, "the reply")
            app.clear_notifications()
            await pilot.pause(0.2)
            shots.append(Path(app.save_screenshot("chat.svg", str(out))))
            # The Status shot is taken while a second reply streams, so a slot is busy and tokens/s moves.
            # Long enough to span status polls (1 s apart): ~300 tokens/s on 2 cores ran a 288-token reply out
            # between two of them.
            chat.query_one("#opt-max-tokens").value = "900"
            await pilot.press(*BUSY_PROMPT, "enter", "f3")

            def busy() -> bool:
                return any(s.get("is_processing") and s.get("generated") for s in app.status.get("slots") or [])

            await until(pilot, busy, 60, "a busy slot")
            await pilot.pause(2.5)  # two more polls: the rate reflects the running reply
            app.clear_notifications()
            shots.append(Path(app.save_screenshot("status.svg", str(out))))
            await until(pilot, lambda: not chat.streaming, 600, "the second reply")
            if len(chat.conversation) != 4:
                raise RuntimeError("the reply streamed while the Chat screen was not shown did not complete")
        return shots


async def _pull_shot(app: LockstepApp, pilot, out: Path, tmp: Path) -> Path:
    """models.svg with a real pull half way: the local Hub holds the weights file until the shot is taken."""
    bundled = next(p for p in bundled_models_dir().iterdir() if p.is_dir())
    hub = Hub({f"lockstep/{bundled.name}": bundled})
    weights = max(bundled.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    hub.hold_after = weights.stat().st_size // 2
    await hub.server.start_server()
    os.environ["HF_ENDPOINT"] = hub.url
    app.manager.store.update({"model_folders": [str(tmp / "models")]})
    try:
        app.start_pull(f"lockstep/{bundled.name}", None)

        def half_way() -> bool:
            p = app.pull_progress
            return p is not None and p.file == weights.name and p.completed >= hub.hold_after // 2

        await until(pilot, half_way, 120, "the pull to get half way")
        await pilot.pause(0.3)
        app.clear_notifications()
        shot = Path(app.save_screenshot("models.svg", str(out)))
        hub.release.set()
        await until(pilot, lambda: app.pull_progress.status in ("success", "error"), 120, "the pull to end")
    finally:
        await hub.server.close()
    return shot


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
