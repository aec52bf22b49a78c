"""contract.middleware, the error and key checks both HTTP servers use, over real HTTP; and that the engine's
and the studio's applications are built from it rather than from copies."""

import logging
import re

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from contract import middleware
from tests.engine_helpers import ROOT

PRODUCT = [p for d in ("contract", "engine", "lockstep_kernels", "settings", "studio") for p in (ROOT / d).rglob("*.py")]


class Known(Exception):
    pass


def _known(e: Exception):
    return middleware.error_response(418, "known", "teapot_error") if isinstance(e, Known) else None


async def _boom(request):
    raise RuntimeError("boom")


async def _known_failure(request):
    raise Known()


async def _ok(request):
    return web.json_response({"ok": True})


async def _read(request):
    return web.json_response({"n": len(await request.read())})


@pytest.fixture
async def client():
    log = logging.getLogger("test.contract_middleware")
    app = web.Application(middlewares=[middleware.errors_middleware(log, _known),
                                       middleware.auth_middleware(lambda r: "sekret", "no key", ("/open",))],
                          client_max_size=16)
    for path, handler in (("/boom", _boom), ("/known", _known_failure), ("/ok", _ok), ("/open", _ok)):
        app.router.add_get(path, handler)
    app.router.add_post("/read", _read)
    c = TestClient(TestServer(app))
    await c.start_server()
    yield c
    await c.close()


KEY = {"Authorization": "Bearer sekret"}


async def error_of(resp):
    body = await resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == resp.status, body
    return body["error"]


async def test_the_key_is_asked_everywhere_but_the_open_paths_and_preflights(client):
    resp = await client.get("/ok")
    assert resp.status == 401 and await error_of(resp) == {"code": 401, "type": "authentication_error",
                                                           "message": "no key"}
    for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}, {"X-Api-Key": "sekre"}):
        assert (await client.get("/ok", headers=headers)).status == 401, headers
    for headers in (KEY, {"Authorization": "bearer  sekret "}, {"X-Api-Key": "sekret"}):
        assert (await client.get("/ok", headers=headers)).status == 200, headers
    assert (await client.get("/open")).status == 200
    assert (await client.options("/ok")).status != 401


async def test_every_failure_answers_in_the_error_shape(client, caplog):
    resp = await client.get("/nothing", headers=KEY)
    assert resp.status == 404 and await error_of(resp) == {"code": 404, "type": "not_found_error",
                                                           "message": "Not Found"}
    resp = await client.post("/ok", headers=KEY)
    assert resp.status == 405 and (await error_of(resp))["message"] == "Method Not Allowed"
    resp = await client.post("/read", data=b"x" * 64, headers=KEY)
    err = await error_of(resp)
    assert resp.status == 413 and err["type"] == "invalid_request_error" and "16" in err["message"], err
    resp = await client.get("/known", headers=KEY)
    assert resp.status == 418 and await error_of(resp) == {"code": 418, "type": "teapot_error", "message": "known"}
    with caplog.at_level(logging.ERROR, "test.contract_middleware"):
        resp = await client.get("/boom", headers=KEY)
    assert resp.status == 500 and await error_of(resp) == {"code": 500, "type": "server_error",
                                                           "message": "internal error: RuntimeError: boom"}
    assert any(r.exc_info and "GET /boom failed" in r.getMessage() for r in caplog.records)


def test_error_types_by_status():
    assert middleware.error_body(409, "m", extra={"field": "x"}) == {
        "error": {"code": 409, "type": "invalid_request_error", "message": "m", "field": "x"}}
    assert middleware.error_body(502, "m")["error"]["type"] == "server_error"
    assert middleware.error_body(503, "m", "custom")["error"]["type"] == "custom"


def test_the_middlewares_are_written_once():
    """No server module checks keys or turns aiohttp's HTTP exceptions into the error shape itself."""
    own = [p.relative_to(ROOT).as_posix() for p in PRODUCT
           if re.search(r"same_key\(|presented_key\(|except web\.HTTPException", p.read_text())]
    assert sorted(own) == ["contract/auth.py", "contract/middleware.py"], own


async def test_the_studio_answers_a_missing_key_with_its_message(tmp_path):
    from settings import SettingsStore
    from studio.api import build_app
    from studio.catalog import Catalog
    from studio.manager import LoadManager
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([tmp_path], include_bundled=False),
                          logs=tmp_path / "logs")
    c = TestClient(TestServer(build_app(manager, api_key="sesame")))
    await c.start_server()
    try:
        resp = await c.get("/api/status")
        assert resp.status == 401 and await error_of(resp) == {
            "code": 401, "type": "authentication_error", "message": "invalid or missing API key"}
        resp = await c.get("/api/nothing", headers={"X-Api-Key": "sesame"})
        assert resp.status == 404 and (await error_of(resp))["type"] == "not_found_error"
    finally:
        await c.close()


async def test_the_engine_answers_a_missing_key_with_llama_servers_message(engine_factory, tiny_llama_noeos):
    keyed = engine_factory(tiny_llama_noeos, api_key="sekret")
    async with aiohttp.ClientSession() as s:
        async with s.get(keyed.base + "/props") as r:
            assert r.status == 401 and await error_of(r) == {"code": 401, "type": "authentication_error",
                                                             "message": "Invalid API Key"}
        async with s.get(keyed.base + "/props", headers={"X-Api-Key": "sekret"}) as r:
            assert r.status == 200
        async with s.get(keyed.base + "/nothing", headers={"X-Api-Key": "sekret"}) as r:
            assert r.status == 404 and (await error_of(r))["type"] == "not_found_error"
