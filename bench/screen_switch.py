"""Time a screen switch in the studio TUI: from the key press to the new screen laid out and painted.

Runs the real app headless (Textual's Pilot) over a real LoadManager with fresh config and log folders;
`--load` loads the bundled model on the CPU first so the status poll has an engine to ask.
Prints per screen, in CPU ms of the studio's process (the engine child excluded), the first visit (compose and mount) and the visits after the second (the second
restyles each screen once more, see the report). Pilot's own key handling is included.

    python bench/screen_switch.py [--rounds 5] [--load] [--size 120x40]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from settings import LoadRequest, SettingsStore  # noqa: E402
from studio.manager import LoadManager  # noqa: E402
from studio.tui.app import LockstepApp  # noqa: E402
from studio.tui.navigation import PLACES  # noqa: E402


async def switch(pilot, app, place) -> float:
    """CPU ms of this process for one switch: wall time on a shared machine mostly measures the neighbours."""
    start = time.process_time()
    await pilot.press(f"f{place.number}")
    while app.current_mode != place.mode:
        await asyncio.sleep(0)
    await pilot.pause()  # the refresh the switch scheduled has run
    return (time.process_time() - start) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load", action="store_true", help="load the bundled model (CPU) first")
    parser.add_argument("--size", default="120x40")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the later visits to FILE")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LOCKSTEP_CONFIG_DIR"] = str(Path(tmp) / "config")
        os.environ["LOCKSTEP_LOG_DIR"] = str(Path(tmp) / "logs")
        manager = LoadManager(SettingsStore())
        app = LockstepApp(manager, api=False)
        async with app.run_test(size=(width, height)) as pilot:
            while app.models is None:
                await pilot.pause(0.05)
            if args.load:
                await manager.load(LoadRequest(model=app.models[0].id, extra_args=["--device", "cpu"]))
            first: dict[str, float] = {}
            later: dict[str, list[float]] = {p.mode: [] for p in PLACES}
            profile = cProfile.Profile() if args.profile else None
            for round_ in range(args.rounds + 2):
                if round_ == 2 and profile is not None:
                    profile.enable()  # past the first two visits, which build and style each screen
                for place in PLACES:
                    ms = await switch(pilot, app, place)
                    if round_ == 0:
                        first[place.mode] = ms
                    elif round_ >= 2:
                        later[place.mode].append(ms)
            if profile is not None:
                profile.disable()
                profile.dump_stats(args.profile)
    print(f"{'screen':<12}{'first ms':>10}{'median ms':>11}{'max ms':>9}  later visits, ms")
    for place in PLACES:
        times = later[place.mode]
        each = " ".join(f"{t:.0f}" for t in times)
        print(f"{place.title:<12}{first[place.mode]:>10.1f}{statistics.median(times):>11.1f}{max(times):>9.1f}  {each}")


if __name__ == "__main__":
    asyncio.run(main())
