"""The auto_load setting with the real engine child on the CPU backend and the real `openai` client: a /v1
request naming a catalog model that is not loaded loads it; a name that is no catalog id stays a 404."""

import asyncio
import signal
import time

import openai
import pytest

from studio import api as studio_api
from studio.api import MANAGER
from tests.studio_helpers import in_process_studio, pause_mid_load
from tests.tiny_models import make_hf_model

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def studio(tmp_path):
    """A studio whose catalog holds two tiny models (ids: client.models)."""
    first = make_hf_model(tmp_path / "models", "llama", seed=0)
    second = make_hf_model(tmp_path / "models", "llama", seed=1, layers=2)
    client = await in_process_studio(tmp_path, first)
    client.models = (first.name, second.name)
    yield client
    await client.close()


async def put_settings(client, **patch):
    resp = await client.put("/api/settings", json=patch)
    assert resp.status == 200, await resp.text()


async def status(client):
    return await (await client.get("/api/status")).json()


async def test_off_a_request_for_another_model_is_a_404_and_loads_nothing(studio):
    first, second = studio.models
    assert (await studio.post("/api/load", json={"model": first, "extra_args": ["--device", "cpu"]})).status == 200
    api = openai.AsyncOpenAI(base_url=str(studio.make_url("/v1")), api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        await api.chat.completions.create(model=second, messages=CHAT, max_tokens=4)
    assert "auto_load" in str(caught.value)
    assert (await status(studio))["model"] == first
    await api.close()


async def test_on_a_request_loads_the_catalog_model_it_names(studio):
    first, second = studio.models
    await put_settings(studio, auto_load=True, load={"extra_args": ["--device", "cpu"], "parallel": 1})
    api = openai.AsyncOpenAI(base_url=str(studio.make_url("/v1")), api_key="unused", max_retries=0)
    # nothing loaded: the named model is loaded for the request
    reply = await api.chat.completions.create(model=first, messages=CHAT, max_tokens=4, seed=1)
    assert reply.choices[0].message.content is not None
    assert ((await status(studio))["model"], (await status(studio))["state"]) == (first, "ready")
    # another one loaded: swapped, as Ollama does
    await api.chat.completions.create(model=second, messages=CHAT, max_tokens=4, seed=1)
    now = await status(studio)
    assert (now["model"], now["state"]) == (second, "ready")
    argv = now["argv"]
    assert argv[argv.index("--parallel") + 1] == "1"  # the stored load defaults
    # a name that is no catalog id loads nothing
    with pytest.raises(openai.NotFoundError):
        await api.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=4)
    assert (await status(studio))["model"] == second
    logs = await (await studio.get("/api/logs")).json()
    assert f"auto_load: loading {second} for a request that names it" in logs["studio"]
    await api.close()


async def test_a_client_that_leaves_during_the_load_does_not_abandon_it(studio, monkeypatch):
    first, _ = studio.models
    await put_settings(studio, auto_load=True, load={"extra_args": ["--device", "cpu"], "parallel": 1})
    manager = studio.server.app[MANAGER]
    left = asyncio.Event()  # the studio's handler for the request has ended (cancelled: the client left)
    real = studio_api.load_on_demand

    async def load_on_demand(*args):
        try:
            return await real(*args)
        finally:
            left.set()

    monkeypatch.setattr(studio_api, "load_on_demand", load_on_demand)
    request = asyncio.ensure_future(studio.post("/v1/chat/completions", json={"model": first, "messages": CHAT,
                                                                              "max_tokens": 4}))
    child = await pause_mid_load(manager)
    try:
        request.cancel()  # the client gives up while the engine loads
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.wait_for(left.wait(), timeout=60)
    finally:
        child.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 120
    while (now := await status(studio))["state"] == "loading":
        assert time.monotonic() < deadline, "the load never ended"
        await asyncio.sleep(0.05)  # a poll interval, bounded by the deadline
    assert (now["state"], now["model"]) == ("ready", first), now
