"""The studio's disk work (catalog scans, log tails) runs off the aiohttp event loop, so a slow disk or a
folder of many models never stalls the other requests (a streaming reply, /api/status)."""

import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer

from settings import SettingsStore
from studio.api import build_app
from studio.catalog import Catalog
from studio.manager import LoadManager


@pytest.fixture
async def studio(tmp_path):
    (tmp_path / "models").mkdir()
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([tmp_path / "models"],
                          include_bundled=False), env={}, logs=tmp_path / "logs")
    manager.threads = []  # the thread of each scan and log read
    for name in ("scan", "find"):
        real = getattr(manager.catalog, name)
        setattr(manager.catalog, name, lambda *a, _real=real: (manager.threads.append(threading.get_ident()),
                                                                _real(*a))[1])
    real_logs = manager.logs
    manager.logs = lambda *a: (manager.threads.append(threading.get_ident()), real_logs(*a))[1]
    client = TestClient(TestServer(build_app(manager)))
    await client.start_server()
    client.manager = manager
    yield client
    await client.close()


async def test_scans_and_log_reads_run_off_the_event_loop(studio):
    loop_thread = threading.get_ident()
    assert (await studio.get("/v1/models")).status == 200
    assert (await studio.get("/api/logs")).status == 200
    resp = await studio.post("/api/load", json={"model": "no-such-model"})
    assert resp.status == 404 and "no-such-model" in (await resp.json())["error"]["message"]
    assert (await studio.put("/api/settings", json={"auto_load": True})).status == 200
    resp = await studio.post("/v1/chat/completions", json={"model": "no-such-model", "messages": []})
    assert resp.status >= 400
    threads = studio.manager.threads
    assert len(threads) >= 4, threads  # each request above read the disk
    assert loop_thread not in threads, "a catalog scan or log read ran on the event loop"
