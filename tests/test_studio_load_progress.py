"""A load's progress as the studio shows it, with the real engine child on the CPU backend, paused
(SIGSTOP) mid-load so that the test sees the load in progress however fast the machine is."""

import asyncio
import signal

from textual.widgets import ProgressBar

from contract.progress import PHASES
from studio.api import MANAGER
from studio.tui.app import LockstepApp
from studio.tui.widgets.load_banner import PHASE_TEXT
from tests.studio_helpers import in_process_studio, pause_mid_load
from tests.test_tui_pilot import LOAD_S, SIZE, pick_model, studio_env, until  # noqa: F401


async def test_status_carries_the_engines_load_progress_while_loading(tmp_path, tiny_llama):
    client = await in_process_studio(tmp_path, tiny_llama)
    manager = client.server.app[MANAGER]
    try:
        load = asyncio.ensure_future(client.post("/api/load", json={"model": client.model, "extra_args": ["--device", "cpu"]}))
        child = await pause_mid_load(manager)
        try:
            status = await (await client.get("/api/status")).json()
            assert status["state"] == "loading"
            progress = status["load_progress"]
            assert progress["phase"] in PHASES, progress
            if progress["phase"] == "weights":
                assert 0 <= progress["bytes"] <= progress["n_bytes"] and progress["n_tensors"] > 0, progress
        finally:
            child.send_signal(signal.SIGCONT)
        assert (await load).status == 200
        ready = await (await client.get("/api/status")).json()
        assert ready["state"] == "ready" and ready["load_progress"] is None
    finally:
        await client.close()


async def test_the_load_screen_and_status_show_the_phase_and_a_progress_bar(studio_env):  # noqa: F811
    app = LockstepApp(api=False)
    async with app.run_test(size=SIZE) as pilot:
        await pick_model(pilot, studio_env)
        await pilot.press("f2")
        await pilot.press("ctrl+l")
        child = await pause_mid_load(app.manager)
        try:
            banner = app.screen.query_one("#load-banner")
            await until(pilot, lambda: (app.status.get("load_progress") or {}).get("phase") is not None, LOAD_S,
                        "a status poll that carries the load's progress")
            progress = app.status["load_progress"]
            text = lambda: str(banner.query_one(".load-banner-text").render())  # noqa: E731
            await until(pilot, lambda: PHASE_TEXT[progress["phase"]] in text(), 10, "the phase on the banner")
            bar = banner.query_one(ProgressBar)
            assert bar.total == (progress["n_bytes"] if progress["phase"] == "weights" else None), progress
            await pilot.press("f3")
            shown = str(app.screen.query_one("#status-load-progress").render())
            assert PHASE_TEXT[progress["phase"]] in shown and app.screen.query_one("#status-loading").display
        finally:
            child.send_signal(signal.SIGCONT)
        await until(pilot, lambda: app.status.get("state") == "ready", LOAD_S, "the load to finish")
        assert not app.screen.query_one("#status-load-progress").display
