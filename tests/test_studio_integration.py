"""The studio with the real engine child on the CPU backend: issue 7's acceptance list."""

import asyncio
import os
import signal
import time

import openai
import pytest

from tests.studio_helpers import in_process_studio
from tests.tiny_models import make_hf_model

DEADLINE_S = 60
CPU = ["--device", "cpu"]
QUANTIZED_KV = ["-ctk", "q8_0"]


@pytest.fixture
async def studio(tmp_path, tiny_llama):
    client = await in_process_studio(tmp_path, tiny_llama)
    yield client
    await client.close()  # the app's cleanup stops the engine


@pytest.fixture
async def studio_hd64(tmp_path):
    """A model whose head dim takes a q8_0 KV cache (tiny_llama's 48 is refused by the engine)."""
    client = await in_process_studio(tmp_path, make_hf_model(tmp_path / "models", layers=2, hidden=128, heads=2, head_dim=64))
    yield client
    await client.close()


async def load(client, **body):
    body.setdefault("extra_args", CPU)
    body.setdefault("ctx_size", 1024)
    resp = await client.post("/api/load", json={"model": client.model, **body})
    return resp.status, await resp.json()


async def status(client):
    resp = await client.get("/api/status")
    return await resp.json()


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_catalog_lists_the_tiny_model(studio):
    models = (await (await studio.get("/api/models")).json())["models"]
    (model,) = [m for m in models if m["id"] == studio.model]
    assert (model["format"], model["architecture"]) == ("hf", "llama")
    assert model["parameters"] > 0 and model["native_context"] == 8192


async def test_load_is_ready_and_exact_is_granted(studio):
    code, body = await load(studio, exact_concurrency="on")
    assert code == 200, body
    assert (body["status"], body["state"], body["exact_concurrency"]) == ("loaded", "ready", "on")
    st = await status(studio)
    assert st["state"] == "ready" and st["exact_concurrency"] == "on"
    assert len(st["slots"]) == 4 and st["pages_free"] is not None
    logs = (await (await studio.get("/api/logs")).json())
    assert "engine preemption armed: mode=auto exact=on" in logs["attempts"][-1]["text"]


async def test_same_settings_already_loaded_and_exact_change_reloads(studio):
    _, first = await load(studio, exact_concurrency="on")
    _, same = await load(studio, exact_concurrency="on")
    assert same["status"] == "already_loaded" and same["pid"] == first["pid"]
    _, changed = await load(studio, exact_concurrency="off")
    assert changed["status"] == "loaded" and changed["pid"] != first["pid"]
    assert changed["exact_concurrency"] == "off"
    assert not alive(first["pid"])


async def test_exact_on_with_quantized_kv_is_refused_with_setting_and_requirement(studio):
    code, body = await load(studio, exact_concurrency="on", extra_args=CPU + QUANTIZED_KV)
    assert code == 422, body
    message = body["error"]["message"]
    assert "exact_concurrency is on" in message
    assert "KV cache type q8_0 is not supported" in message and "use -ctk f16" in message
    assert (await status(studio))["state"] == "failed"


async def test_exact_auto_with_quantized_kv_relaunches_without_it(studio_hd64):
    code, body = await load(studio_hd64, exact_concurrency="auto", extra_args=CPU + QUANTIZED_KV)
    assert code == 200, body
    assert (body["state"], body["exact_concurrency"]) == ("ready", "unavailable")
    assert "KV cache type q8_0 is not supported" in body["exact_reason"]
    assert [a["outcome"] for a in body["attempts"]] == ["exact_refusal", "ready"]
    assert "exact_kv_quantized" in [w["code"] for w in body["warnings"]]


async def test_sigkilled_child_is_reported_and_respawned_by_the_next_request(studio):
    _, body = await load(studio, exact_concurrency="on")
    os.kill(body["pid"], signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE_S
    st = await status(studio)
    while st["state"] != "failed" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        st = await status(studio)
    assert st["state"] == "failed" and "SIGKILL" in st["error"]["message"]
    resp = await studio.post("/v1/chat/completions", json={"model": studio.model, "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200
    st = await status(studio)
    assert st["state"] == "ready" and st["pid"] != body["pid"] and alive(st["pid"])
    assert st["exact_concurrency"] == "on"


async def test_openai_client_streams_a_chat_through_the_proxy(studio):
    await load(studio, exact_concurrency="on")
    api = openai.AsyncOpenAI(base_url=str(studio.make_url("/v1")), api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Hello world"}]
    stream = await api.chat.completions.create(model=studio.model, messages=messages, max_tokens=8,
                                               temperature=0, seed=1, stream=True)
    pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2
    whole = await api.chat.completions.create(model=studio.model, messages=messages, max_tokens=8,
                                              temperature=0, seed=1)
    assert "".join(pieces) == whole.choices[0].message.content  # streamed or not, the same tokens
    await api.close()
