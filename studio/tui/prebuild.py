"""Building every screen before its first visit, in the app's idle time after start-up.

A first visit used to compose and mount a screen's widgets, style each of them and lay them out: 200-500 ms
of CPU on the Load and Settings forms, against about 20 ms for a visit after that. Here each screen is
composed, mounted, given its width classes, styled and laid out off screen, one screen at a time with the
event loop free between them, so a first visit costs what a repeat visit does.

Textual (8.2) has no public call that builds a screen without making it current (install_screen and
get_screen do not mount); `build` is the part of its first switch_mode (App._init_mode) before the screen
resumes, and `settle` the part of the first resume that does not need the screen to be current.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual import events
from textual.screen import Screen
from textual.widget import AwaitMount

if TYPE_CHECKING:
    from studio.tui.app import LockstepApp

GAP_S = 0.05  # between two screens: a key pressed meanwhile waits for one screen's build at most


def build(app: LockstepApp, mode: str) -> tuple[Screen, AwaitMount] | None:
    """Compose and mount a mode's screen now, off screen; None when the mode has one already or the app
    is shutting down (it closes the screens it has, and must not find a new one among them)."""
    if mode in app._screen_stacks or not app.is_running:
        return None
    screen, mounted = app._get_screen(app.MODES[mode]())
    app._load_screen_css(screen)  # the visit will not: switch_mode finds the mode built and only resumes it
    app._screen_stacks[mode] = [screen]
    return screen, mounted


async def settle(app: LockstepApp, screen: Screen) -> None:
    """Width classes, styles, the footer's keys, layout and a first render for the app's size, so that the
    first resume finds every widget styled and every line cache filled, as a repeat visit does."""
    size = app.size
    await screen._on_resize(events.Resize(size, size))  # a never-resumed screen only takes the classes
    screen.update_node_styles(animate=False)
    screen._styled_once = True  # see StudioScreen._on_screen_resume
    screen.refresh_bindings()  # the footer composes its keys after the screen's next refresh
    await asyncio.sleep(GAP_S)
    screen._refresh_layout(size)
    screen._compositor.render_update(full=True)  # the frame is dropped; the widgets keep their rendered lines


class Prebuilder:
    """Builds the screens one after another; `stop` lets a mount in flight finish and starts no other, since
    the app's shutdown closes the screens it has and must not close one whose widgets are still mounting."""

    def __init__(self, app: LockstepApp) -> None:
        self.app = app
        self.stopped = False
        self._between = asyncio.Event()  # clear while a screen and its widgets are being mounted
        self._between.set()

    async def run(self, modes: Iterable[str]) -> None:
        for mode in modes:
            await asyncio.sleep(GAP_S)
            built = None if self.stopped else build(self.app, mode)
            if built is None:
                continue
            screen, mounted = built
            self._between.clear()
            try:
                await mounted  # the widgets, in the screen's own message loop; then the screen's on_mount
                await AwaitMount(screen, [screen])
            finally:
                self._between.set()
            await asyncio.sleep(0)
            if not screen.is_current and not self.stopped:  # visited meanwhile: its resume did all this
                await settle(self.app, screen)
        if self.stopped:
            return
        # The screens are built for the app's life: a full collection that scans them all takes 100-300 ms
        # whenever it falls, a stall in whichever key press it lands on. Frozen, collections skip them.
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        self.stopped = True
        await self._between.wait()


def thaw() -> None:
    """Undo the freeze when the app ends (a test process runs many apps)."""
    gc.unfreeze()
