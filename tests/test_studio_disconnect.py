"""A client that leaves a non-streaming request through the TUI's API server stops its generation.

The real engine child on the CPU backend behind the real ApiServer (the one `make run` serves), so the
server's own settings are what is tested; the tiny model without an end token runs to its limit unless
the request is cancelled.
"""

import asyncio
import os
import time

import aiohttp
import pytest

from settings import SettingsStore
from settings.models import LoadRequest
from studio.catalog import Catalog
from studio.engine_child import free_port
from studio.manager import LoadManager
from studio.tui.api_server import ApiServer

DEADLINE_S = 120
MAX_TOKENS = 3000


async def predicted(session, child) -> int:
    async with session.get(child.base_url + "/metrics", headers=child.auth_headers) as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.split(" ")[0].endswith("tokens_predicted_total"))
    return int(float(line.split()[-1]))


async def busy(session, child) -> bool:
    async with session.get(child.base_url + "/slots", headers=child.auth_headers) as resp:
        return any(s["is_processing"] for s in await resp.json())


async def until(predicate, what):
    deadline = time.monotonic() + DEADLINE_S
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def served(tmp_path, tiny_llama_noeos):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    manager = LoadManager(SettingsStore(tmp_path / "config"),
                          catalog=Catalog([tiny_llama_noeos.parent], include_bundled=False), env=env,
                          logs=tmp_path / "logs")
    await manager.load(LoadRequest(model=tiny_llama_noeos.name, ctx_size=4096, parallel=1,
                                   extra_args=["--device", "cpu"]))
    server = ApiServer(manager, "127.0.0.1", free_port())
    url = await server.start()
    yield url, manager, tiny_llama_noeos.name
    await server.stop()
    await manager.shutdown()


async def test_leaving_a_non_streaming_request_stops_its_generation(served):
    url, manager, model = served
    child = manager.loaded.child
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS,
            "temperature": 0}
    async with aiohttp.ClientSession() as engine:
        client = aiohttp.ClientSession()
        request = asyncio.ensure_future(client.post(url + "/v1/chat/completions", json=body))
        await until(lambda: busy(engine, child), "the engine to start generating")
        request.cancel()
        await client.close()  # the client is gone: its connection closes
        await until(lambda: _idle(engine, child), "the engine to stop generating")
        assert await predicted(engine, child) < MAX_TOKENS - 2  # cut short, not run to its limit


async def _idle(session, child) -> bool:
    return not await busy(session, child)
