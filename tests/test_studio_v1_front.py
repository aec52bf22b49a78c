"""The studio's /v1 front over the stand-in engine: the model list without an engine, model names checked
against the loaded model, and the default length limit."""

import openai
import pytest

from studio.openai_front import DEFAULT_MAX_TOKENS
from tests.test_studio_api import load, make_client, models_dir  # noqa: F401  (fixtures)
from tests.test_studio_standin import standin_fixture  # noqa: F401  (the standin fixture)


@pytest.fixture
async def client(make_client):  # noqa: F811  (make_client is the imported fixture)
    return await make_client()


async def test_v1_models_lists_the_catalog_when_nothing_is_loaded(client, standin):
    resp = await client.get("/v1/models")
    assert resp.status == 200
    body = await resp.json()
    assert [m["id"] for m in body["data"]] == ["tiny"]
    assert body["data"][0]["loaded"] is False and body["loaded"] is None
    assert standin.calls() == []  # answered without starting an engine


async def test_v1_models_says_which_is_loaded_through_the_openai_client(client):
    await load(client)
    api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    models = await api.models.list()
    assert [(m.id, m.model_extra["loaded"]) for m in models.data] == [("tiny", True)]
    await api.close()


async def test_a_model_that_is_not_loaded_is_a_404_naming_the_loaded_one(client, standin):
    await load(client)
    api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        await api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "'gpt-4o' is not loaded" in str(caught.value) and "'tiny'" in str(caught.value)
    assert standin.requests() == []  # the engine never saw it
    ok = await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content
    await api.close()


async def test_a_request_without_a_limit_gets_the_studio_default(client, standin):
    await load(client)
    for extra in ({}, {"max_tokens": 7}):
        resp = await client.post("/v1/chat/completions",
                                 json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **extra})
        assert resp.status == 200
    sent = [r["body"] for r in standin.requests()]
    assert sent[0]["max_tokens"] == DEFAULT_MAX_TOKENS
    assert sent[1]["max_tokens"] == 7


async def test_a_context_beyond_the_native_one_is_refused_before_launching(client, standin):
    resp = await client.post("/api/load", json={"model": "tiny", "ctx_size": 16_777_216, "parallel": 1})
    err = (await resp.json())["error"]
    assert (resp.status, err["type"]) == (400, "context_beyond_native")
    assert "2048 tokens a chat" in err["message"]
    assert standin.calls() == []


async def test_each_proxied_request_gets_a_line_in_the_studio_log(client, tmp_path):
    await load(client)
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
    assert resp.status == 200
    await resp.read()
    log = (tmp_path / "logs" / "studio.log").read_text()
    assert "request c /v1/chat/completions:" in log and "ms, status 200" in log
