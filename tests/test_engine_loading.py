"""While the model loads the port already answers: /health and every other endpoint say 503."""

from aiohttp.test_utils import TestClient, TestServer

from engine.cli import build_parser, engine_args
from engine.exact import ExactStatus
from engine.server.app import build_app
from engine.server.state import EngineState


def loading_state(*extra: str) -> EngineState:
    opts = engine_args(build_parser().parse_args(["-m", "/models/x", *extra]), env={})
    return EngineState(opts, ExactStatus(False, False, "not requested", "cpu"), "cpu")


async def test_everything_is_503_while_loading():
    async with TestClient(TestServer(build_app(loading_state()))) as client:
        for method, path in (("GET", "/health"), ("GET", "/props"), ("GET", "/v1/models"),
                             ("POST", "/completion"), ("POST", "/v1/chat/completions")):
            r = await client.request(method, path)
            assert r.status == 503, path
            assert await r.json() == {"error": {"code": 503, "type": "unavailable_error",
                                                "message": "Loading model"}}


async def test_api_key_is_checked_before_the_loading_answer_except_on_health():
    async with TestClient(TestServer(build_app(loading_state("--api-key", "k")))) as client:
        assert (await client.get("/health")).status == 503
        assert (await client.get("/props")).status == 401
        assert (await client.get("/props", headers={"Authorization": "Bearer k"})).status == 503
