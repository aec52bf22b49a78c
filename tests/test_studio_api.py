"""The load manager behind the REST API, through real HTTP, with the scripted stand-in engine."""

import asyncio
import os
import signal
import time

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from settings import SettingsStore
from studio.api import MANAGER, build_app
from studio.catalog import Catalog
from studio.manager import LoadManager
from tests.test_studio_standin import standin_fixture, write_gguf  # noqa: F401  (the standin fixture)

DEADLINE_S = 30
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def models_dir(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    write_gguf(folder / "tiny.gguf", context=2048)
    return folder


@pytest.fixture
async def make_client(tmp_path, standin, models_dir):
    made = []

    async def make(api_key=None, **env):
        manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([models_dir], include_bundled=False),
                              env=standin.env(**env), logs=tmp_path / "logs", engine_cmd=standin.cmd)
        client = TestClient(TestServer(build_app(manager, api_key=api_key)))
        await client.start_server()
        made.append(client)
        client.manager = manager
        return client

    yield make
    for client in made:
        await client.close()  # runs the app's cleanup, which stops any engine child




@pytest.fixture
async def client(make_client):
    return await make_client()


async def load(client, **body):
    resp = await client.post("/api/load", json={"model": "tiny", **body})
    return resp.status, await resp.json()


async def status(client):
    resp = await client.get("/api/status")
    assert resp.status == 200
    return await resp.json()


async def poll_status(client, predicate):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        st = await status(client)
        if predicate(st):
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"status never matched; last: {st}")


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_models_lists_the_catalog(client, models_dir):
    resp = await client.get("/api/models")
    body = await resp.json()
    assert resp.status == 200
    (model,) = body["models"]
    assert model["id"] == "tiny" and model["format"] == "gguf" and model["native_context"] == 2048
    assert set(model) >= {"id", "path", "format", "architecture", "parameters", "tensor_types", "size_bytes",
                          "native_context"}


async def test_load_reports_ready_and_what_was_granted(client):
    code, body = await load(client, exact_concurrency="on", ctx_size=1024)
    assert code == 200, body
    assert body["status"] == "loaded"
    assert body["exact_concurrency"] == "on" and body["requested_exact_concurrency"] == "on"
    assert body["exact_reason"] is None
    assert "--exact-concurrency" in body["argv"] and body["argv"][body["argv"].index("--ctx-size") + 1] == "1024"
    assert "--api-key" not in body["argv"]  # the child's api key travels by environment, never argv
    assert len(body["attempts"]) == 1 and body["attempts"][0]["outcome"] == "ready"
    st = await status(client)
    assert st["state"] == "ready" and st["model"] == "tiny" and st["port"] == body["port"]
    assert st["pages_used"] == 3 and st["pages_free"] == 61 and st["parks"] == 2
    assert len(st["slots"]) == 4


async def test_same_settings_answer_already_loaded_and_exact_change_reloads(client):
    _, first = await load(client, exact_concurrency="off")
    code, again = await load(client, exact_concurrency="off")
    assert code == 200 and again["status"] == "already_loaded" and again["pid"] == first["pid"]
    code, changed = await load(client, exact_concurrency="on")
    assert code == 200 and changed["status"] == "loaded"
    assert changed["pid"] != first["pid"] and changed["exact_concurrency"] == "on"
    assert gone(first["pid"])
    code, other = await load(client, exact_concurrency="on", parallel=2)
    assert other["status"] == "loaded" and other["pid"] != changed["pid"]


async def test_exact_on_with_quantized_kv_is_refused_naming_setting_and_requirement(client):
    code, body = await load(client, exact_concurrency="on", extra_args=["-ctk", "q8_0"])
    assert code == 422
    err = body["error"]
    assert err["type"] == "load_failed" and err["failure"] == "exact_refusal" and err["code"] == 422
    assert "exact_concurrency is on" in err["message"]
    assert "KV cache type q8_0 is not supported; use -ctk f16 (or bf16)" in err["message"]
    st = await status(client)
    assert st["state"] == "failed" and st["error"]["type"] == "exact_refusal"


async def test_exact_auto_with_quantized_kv_runs_without_it_and_says_why(client):
    code, body = await load(client, exact_concurrency="auto", extra_args=["-ctk", "q8_0"])
    assert code == 200, body
    assert body["exact_concurrency"] == "unavailable" and body["requested_exact_concurrency"] == "auto"
    assert "KV cache type q8_0 is not supported" in body["exact_reason"]
    assert [w["code"] for w in body["warnings"]] == ["exact_kv_quantized"]
    assert [a["outcome"] for a in body["attempts"]] == ["exact_refusal", "ready"]
    assert body["argv"][body["argv"].index("--exact-concurrency") + 1] == "off"


async def test_a_child_without_the_granted_field_is_unavailable_never_on(make_client):
    client = await make_client(STANDIN_NO_EXACT_FIELD=1)
    _, body = await load(client, exact_concurrency="on")
    assert body["exact_concurrency"] == "unavailable"
    assert "did not report" in body["exact_reason"]


async def test_a_child_that_denies_exact_reports_its_reason(make_client):
    client = await make_client(STANDIN_DENY="backend lacks row-invariant matmul")
    _, body = await load(client, exact_concurrency="on")
    assert (body["exact_concurrency"], body["exact_reason"]) == ("unavailable", "backend lacks row-invariant matmul")


async def test_environment_outranks_the_request(make_client):
    client = await make_client(LOCKSTEP_EXACT_CONCURRENCY="on")
    _, body = await load(client, exact_concurrency="off")
    assert (body["requested_exact_concurrency"], body["exact_concurrency"]) == ("on", "on")


async def test_killed_child_is_reported_and_the_next_request_respawns_it_once(client):
    _, body = await load(client, exact_concurrency="on")
    os.kill(body["pid"], signal.SIGKILL)
    st = await poll_status(client, lambda s: s["state"] == "failed")
    assert "SIGKILL" in st["error"]["message"]
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 200
    assert (await resp.json())["choices"][0]["message"]["content"]
    st = await status(client)
    assert st["state"] == "ready" and st["pid"] != body["pid"] and st["exact_concurrency"] == "on"

    os.kill(st["pid"], signal.SIGKILL)
    await poll_status(client, lambda s: s["state"] == "failed")
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 503
    assert "load the model again" in (await resp.json())["error"]["message"]
    code, again = await load(client, exact_concurrency="on")  # an explicit load always relaunches
    assert code == 200 and again["status"] == "loaded"


async def test_preemption_armed_line_on_every_successful_load(client, tmp_path):
    _, first = await load(client, exact_concurrency="on")
    _, second = await load(client, exact_concurrency="auto", extra_args=["-ctk", "q8_0"])
    studio_log = (tmp_path / "logs" / "studio.log").read_text()
    assert "engine preemption armed: mode=auto exact=on" in studio_log
    assert "engine preemption armed: mode=auto exact=off" in studio_log
    assert "engine preemption armed: mode=auto exact=on" in open(first["attempts"][-1]["log"]).read()
    assert "engine preemption armed: mode=auto exact=off" in open(second["attempts"][-1]["log"]).read()
    # the failed first attempt of the second load is not armed
    assert "engine preemption armed" not in open(second["attempts"][0]["log"]).read()


async def test_logs_per_attempt(client):
    await load(client, exact_concurrency="auto", extra_args=["-ctk", "q8_0"])
    resp = await client.get("/api/logs")
    body = await resp.json()
    assert [a["attempt"] for a in body["attempts"]] == [1, 2]
    assert "exact concurrency: KV cache type q8_0" in body["attempts"][0]["text"]
    assert "standin listening" in body["attempts"][1]["text"]
    assert "loading tiny" in body["studio"]
    resp = await client.get("/api/logs?tail=10")
    assert all(len(a["text"].encode()) <= 10 for a in (await resp.json())["attempts"])


async def test_unload_stops_the_child(client):
    _, body = await load(client)
    resp = await client.post("/api/unload")
    assert (await resp.json())["status"] == "unloaded"
    assert gone(body["pid"])
    assert (await status(client))["state"] == "stopped"
    resp = await client.post("/api/unload")
    assert (await resp.json())["status"] == "not_loaded"
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 503 and (await resp.json())["error"]["type"] == "no_model_loaded"


async def test_openai_client_streams_through_the_proxy(client, tmp_path):
    await load(client)
    gate = tmp_path / "gate"
    api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    stream = await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               stream=True, extra_body={"gate": str(gate)})
    pieces = []
    async for chunk in stream:
        pieces.append(chunk.choices[0].delta.content)
        if len(pieces) == 1:
            # The engine holds the rest until this file exists: the first piece arrived before
            # the engine finished, so the proxy streams rather than buffers.
            gate.touch()
    assert pieces == ["Hello", " from", " the", " stand-in"]
    plain = await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].message.content == "Hello from the stand-in"
    await api.close()


@pytest.mark.parametrize(("body", "code", "kind", "text"), [
    ({"model": "tiny", "extra_args": ["--port", "1"]}, 400, "invalid_extra_args", "--port"),
    ({"model": "tiny", "extra_args": ["-c"]}, 400, "invalid_extra_args", "-c needs a value"),
    ({"model": "tiny", "ctx_size": -1}, 400, "invalid_request_error", "ctx_size"),
    ({"model": "tiny", "bogus": 1}, 400, "invalid_request_error", "bogus"),
    ({"model": "nope"}, 404, "model_not_found", "nope"),
    ({}, 400, "invalid_request_error", "model"),
    ([1, 2], 400, "invalid_request_error", "JSON object"),
])
async def test_bad_load_requests(client, standin, body, code, kind, text):
    resp = await client.post("/api/load", json=body)
    err = (await resp.json())["error"]
    assert (resp.status, err["code"], err["type"]) == (code, code, kind)
    assert text in err["message"]
    assert standin.calls() == []  # nothing was spawned


async def test_malformed_json_and_unknown_routes_are_json_errors(client):
    resp = await client.post("/api/load", data=b"{nope", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["error"]["type"] == "invalid_request_error"
    resp = await client.get("/api/nothing")
    assert resp.status == 404 and (await resp.json())["error"]["code"] == 404
    resp = await client.delete("/api/status")
    assert resp.status == 405 and "error" in await resp.json()


async def test_api_key_is_required_when_set(make_client):
    client = await make_client(api_key="sesame")
    resp = await client.get("/api/status")
    assert resp.status == 401 and (await resp.json())["error"]["type"] == "authentication_error"
    resp = await client.get("/api/status", headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    resp = await client.get("/api/status", headers={"Authorization": "Bearer sesame"})
    assert resp.status == 200
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Api-Key": "sesame"})
    assert resp.status == 503  # authorised, and no model loaded


async def test_settings_get_and_put(client, tmp_path):
    resp = await client.get("/api/settings")
    body = await resp.json()
    assert body["settings"]["api"]["port"] == 8765 and body["problems"] == []
    resp = await client.put("/api/settings", json={"load": {"ctx_size": 2048}, "preempt_mode": "park"})
    assert resp.status == 200
    stored = SettingsStore(tmp_path / "config").settings
    assert (stored.load.ctx_size, stored.preempt_mode, stored.load.parallel) == (2048, "park", 4)
    resp = await client.put("/api/settings", json={"load": {"ctx_size": "big"}})
    assert resp.status == 400 and "load.ctx_size" in (await resp.json())["error"]["message"]
    assert SettingsStore(tmp_path / "config").settings.load.ctx_size == 2048
    # the stored load defaults and preempt mode are what the next load uses
    _, loaded = await load(client)
    assert loaded["argv"][loaded["argv"].index("--ctx-size") + 1] == "2048"
    assert loaded["preempt_mode"] == "park"


async def test_corrupt_settings_are_reported_by_the_api(make_client, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings.json").write_text("{broken")
    client = await make_client()
    body = await (await client.get("/api/settings")).json()
    assert len(body["problems"]) == 1 and "settings.json.corrupt-" in body["problems"][0]
    assert "damaged" in (tmp_path / "logs" / "studio.log").read_text()


async def test_exact_concurrency_setting_endpoint(make_client):
    client = await make_client(LOCKSTEP_EXACT="1")
    view = await (await client.get("/api/settings/exact-concurrency")).json()
    assert view == {"exact_concurrency": None, "effective": "on", "default": "on", "env_override": None,
                    "active": None, "reload_required": False}
    await load(client)  # inherited LOCKSTEP_EXACT=1 counts as on
    view = await (await client.get("/api/settings/exact-concurrency")).json()
    assert (view["active"], view["reload_required"]) == ("on", False)
    resp = await client.put("/api/settings/exact-concurrency", json={"exact_concurrency": "off"})
    view = await resp.json()
    assert (view["exact_concurrency"], view["effective"], view["reload_required"]) == ("off", "off", True)
    resp = await client.put("/api/settings/exact-concurrency", json={"exact_concurrency": "maybe"})
    assert resp.status == 400
    resp = await client.put("/api/settings/exact-concurrency", json={"exact_concurrency": None})
    assert (await resp.json())["effective"] == "on"


async def test_exact_concurrency_endpoint_shows_the_env_override(make_client):
    client = await make_client(LOCKSTEP_EXACT_CONCURRENCY="auto")
    await client.put("/api/settings/exact-concurrency", json={"exact_concurrency": "on"})
    view = await (await client.get("/api/settings/exact-concurrency")).json()
    assert (view["exact_concurrency"], view["env_override"], view["effective"]) == ("on", "auto", "auto")


async def test_shutdown_during_a_load_stops_the_child_it_waited_for(make_client, standin):
    client = await make_client(STANDIN_HANG=1)  # never healthy: the load waits for its deadline
    pending = asyncio.ensure_future(client.post("/api/load", json={"model": "tiny"}))
    deadline = time.monotonic() + DEADLINE_S
    while not standin.calls() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert (await status(client))["state"] == "loading"
    pid = standin.calls()[0]["pid"]
    started = time.monotonic()
    await client.app[MANAGER].shutdown()
    assert time.monotonic() - started < 15  # not the 180 s health deadline
    assert gone(pid)
    resp = await pending
    assert resp.status == 503 and (await resp.json())["error"]["type"] == "load_cancelled"


async def test_an_engine_that_cannot_start_is_a_json_error(tmp_path, models_dir):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([models_dir], include_bundled=False),
                          env={"PATH": "/usr/bin:/bin"}, logs=tmp_path / "logs",
                          engine_cmd=[str(tmp_path / "no-such-engine")])
    client = TestClient(TestServer(build_app(manager)))
    await client.start_server()
    try:
        resp = await client.post("/api/load", json={"model": "tiny"})
        err = (await resp.json())["error"]
        assert (resp.status, err["type"]) == (500, "server_error")
        assert "no-such-engine" in err["message"]
        st = await status(client)
        assert st["state"] == "failed" and "no-such-engine" in st["error"]["message"]
    finally:
        await client.close()
