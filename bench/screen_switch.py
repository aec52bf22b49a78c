"""Time screen switches in the studio TUI: from the key press to the first frame of the new screen.

Each start is a fresh process running the real app headless (Textual's Pilot) over a real LoadManager
with fresh config and log folders. The key goes in through the driver, as a terminal's would; the switch
ends when the new screen's first frame is rendered (the compositor hands it to App._display). Between
keys the app is left alone for `--think` seconds, as a person would, and after start-up until it is
idle (its prebuild worker done; the report gives that time): work the app does in its idle time is not
counted as a switch. Per screen: the first visit and
the visits after it, in wall ms and in CPU ms of the studio's process (wall time on a shared machine
also measures the neighbours). The report is the median over the starts.

    python bench/screen_switch.py [--starts 5] [--repeats 3] [--size 120x40] [--json FILE] [--md FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def one_start(size: tuple[int, int], repeats: int, think: float) -> dict:
    from textual import events

    from settings import SettingsStore
    from studio.manager import LoadManager
    from studio.tui.app import LockstepApp
    from studio.tui.navigation import PLACES

    manager = LoadManager(SettingsStore())
    app = LockstepApp(manager, api=False)
    frames: list[tuple[object, float, float]] = []
    display = app._display

    def recording_display(screen, renderable) -> None:
        if renderable is not None:
            frames.append((screen, time.perf_counter(), time.process_time()))
        display(screen, renderable)

    app._display = recording_display  # type: ignore[method-assign]
    visits: dict[str, list[dict[str, float]]] = {p.mode: [] for p in PLACES}
    started = time.perf_counter()
    async with app.run_test(size=size) as pilot:
        while app.models is None:
            await pilot.pause(0.05)
        ready = time.perf_counter() - started
        # Start-up is over when the app's own idle-time work (building the other screens) is.
        def building() -> bool:
            if not hasattr(app, "prebuild_screens"):
                return False  # an app from before the prebuild: the think time below is its idle time
            return app.prebuild_worker is None or not app.prebuild_worker.is_finished

        while building():
            if time.perf_counter() > started + 60:
                raise TimeoutError("the app was not idle within 60 s")
            await asyncio.sleep(0.01)
        idle = time.perf_counter() - started
        await pilot.pause(think)
        # Models is where the app starts; its first visit is the switch back to it from another screen.
        order = [p for p in PLACES if p.mode != app.current_mode] + [p for p in PLACES if p.mode == app.current_mode]
        for _ in range(repeats + 1):
            for place in order:
                frames.clear()
                wall0, cpu0 = time.perf_counter(), time.process_time()
                app._driver.send_message(events.Key(f"f{place.number}", None))
                deadline = wall0 + 30
                while not any(s is app.screen and app.current_mode == place.mode for s, _, _ in frames):
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"no frame of {place.mode} within 30 s")
                    await asyncio.sleep(0.001)
                _, wall1, cpu1 = next(f for f in frames if f[0] is app.screen)
                visits[place.mode].append({"wall_ms": (wall1 - wall0) * 1000, "cpu_ms": (cpu1 - cpu0) * 1000})
                await pilot.pause(think)
    return {"ready_s": ready, "idle_s": idle, "visits": visits}


def median_table(starts: list[dict]) -> dict[str, dict[str, float]]:
    table = {}
    for mode in starts[0]["visits"]:
        first = [s["visits"][mode][0] for s in starts]
        later = [v for s in starts for v in s["visits"][mode][1:]]
        table[mode] = {
            "first_wall_ms": statistics.median(v["wall_ms"] for v in first),
            "first_cpu_ms": statistics.median(v["cpu_ms"] for v in first),
            "first_wall_ms_max": max(v["wall_ms"] for v in first),
            "repeat_wall_ms": statistics.median(v["wall_ms"] for v in later),
            "repeat_cpu_ms": statistics.median(v["cpu_ms"] for v in later),
        }
    return table


def markdown(report: dict) -> str:
    lines = [f"# Studio screen switches ({report['label']})", "",
             f"Median of {report['starts']} fresh app starts, headless {report['size']}, "
             f"{report['repeats']} repeat visits each, {report['think_s']} s between keys; "
             f"load average before/after {report['load_before']} / {report['load_after']}, "
             f"{report['cpus']} CPUs, git {report['commit']}. Command: `{report['command']}`.", "",
             "| screen | first wall ms | first CPU ms | first wall max | repeat wall ms | repeat CPU ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for mode, row in report["median"].items():
        lines.append(f"| {mode} | {row['first_wall_ms']:.0f} | {row['first_cpu_ms']:.0f} | "
                     f"{row['first_wall_ms_max']:.0f} | {row['repeat_wall_ms']:.0f} | {row['repeat_cpu_ms']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="120x40")
    parser.add_argument("--think", type=float, default=0.5, help="seconds between keys (and after start-up)")
    parser.add_argument("--label", default="CPU machine")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single start, as JSON
    args = parser.parse_args()
    size = tuple(int(x) for x in args.size.split("x"))
    if args.one:
        print(json.dumps(asyncio.run(one_start(size, args.repeats, args.think))))
        return
    load_before = os.getloadavg()
    starts = []
    for n in range(args.starts):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "LOCKSTEP_CONFIG_DIR": f"{tmp}/config", "LOCKSTEP_LOG_DIR": f"{tmp}/logs",
                   "XDG_CONFIG_HOME": f"{tmp}/xdg-config", "XDG_STATE_HOME": f"{tmp}/xdg-state"}
            out = subprocess.run([sys.executable, __file__, "--one", "--size", args.size, "--repeats",
                                  str(args.repeats), "--think", str(args.think)],
                                 env=env, capture_output=True, text=True, timeout=600)
            if out.returncode:
                sys.exit(f"start {n + 1} failed:\n{out.stderr}")
            starts.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"start {n + 1}/{args.starts} done", file=sys.stderr)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    report = {
        "label": args.label, "size": args.size, "starts": args.starts, "repeats": args.repeats,
        "think_s": args.think, "cpus": os.cpu_count(), "python": platform.python_version(), "commit": commit,
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "command": "python bench/screen_switch.py " + " ".join(sys.argv[1:]),
        "median": median_table(starts), "runs": starts,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.md:
        args.md.write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
