"""The studio's REST API served from the TUI's own event loop, over the TUI's LoadManager."""

from __future__ import annotations

from aiohttp import web

from studio.api import build_app
from studio.manager import LoadManager

SHUTDOWN_S = 0.5


class ApiServer:
    def __init__(self, manager: LoadManager, host: str, port: int, api_key: str | None = None) -> None:
        self.manager = manager
        self.host = host
        self.port = port
        self.api_key = api_key
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Serve, or raise OSError (port taken, address not available) having cleaned up."""
        # The TUI stops the engine itself on exit, also when the API never started.
        app = build_app(self.manager, api_key=self.api_key, host=self.host, stop_engine_on_cleanup=False)
        # handler_cancellation: a client that leaves stops its proxied generation, streaming or not;
        # a short shutdown_timeout: quitting cancels running requests instead of waiting for them.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
