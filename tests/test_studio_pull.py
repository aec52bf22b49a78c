"""Model pulls from a local server in the Hub's layout (HF_ENDPOINT): POST /api/models/pull streams progress
and lands the model in the first model folder; unknown repos and files, an offline Hub, and a resumed file."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil

import pytest
from aiohttp.test_utils import TestClient, TestServer

from settings import SettingsStore
from studio.api import build_app
from studio.catalog import Catalog
from studio.manager import LoadManager
from studio.pull import PullProgress, pull
from tests.hub_server import Hub
from tests.test_studio_standin import standin_fixture, write_gguf  # noqa: F401  (the standin fixture)


@pytest.fixture
async def hub(tmp_path, tiny_llama, monkeypatch):
    gguf_repo = tmp_path / "hub" / "gguf"
    gguf_repo.mkdir(parents=True)
    write_gguf(gguf_repo / "small.gguf", context=4096)
    (gguf_repo / "README.md").write_text("a test repo")
    hf_repo = tmp_path / "hub" / "hf"
    shutil.copytree(tiny_llama, hf_repo)
    (hf_repo / "pytorch_model.bin").write_bytes(b"not wanted")
    server = Hub({"lockstep/small-gguf": gguf_repo, "lockstep/tiny-llama": hf_repo})
    await server.server.start_server()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server
    server.release.set()
    await server.server.close()


@pytest.fixture
def pull_dir(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    return folder


@pytest.fixture
async def client(tmp_path, standin, pull_dir):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([pull_dir], include_bundled=False),
                          env=standin.env(), logs=tmp_path / "logs", engine_cmd=standin.cmd)
    client = TestClient(TestServer(build_app(manager)))
    await client.start_server()
    resp = await client.put("/api/settings", json={"model_folders": [str(pull_dir)]})
    assert resp.status == 200
    yield client
    await client.close()


async def pull_lines(client, **body):
    resp = await client.post("/api/models/pull", json=body)
    text = await resp.text()
    return resp.status, [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_a_gguf_file_is_pulled_with_progress_into_the_first_model_folder(hub, client, pull_dir):
    status, lines = await pull_lines(client, repo="lockstep/small-gguf", file="small.gguf")
    assert status == 200, lines
    assert lines[-1]["status"] == "success", lines
    path = pull_dir / "lockstep--small-gguf" / "small.gguf"
    assert lines[-1]["path"] == str(path) and path.is_file()
    downloading = [x for x in lines if x["status"] == "downloading"]
    assert downloading and all(x["total"] == path.stat().st_size for x in downloading)
    assert downloading[-1]["completed"] == path.stat().st_size and "rate" in downloading[-1]
    models = (await (await client.get("/api/models")).json())["models"]
    assert lines[-1]["model"] in [m["id"] for m in models]
    assert not (pull_dir / "lockstep--small-gguf" / "README.md").exists()  # only the file asked for


async def test_a_safetensors_repo_is_pulled_whole_without_other_formats(hub, client, pull_dir, tiny_llama):
    status, lines = await pull_lines(client, repo="lockstep/tiny-llama")
    assert status == 200 and lines[-1]["status"] == "success", lines
    folder = pull_dir / "lockstep--tiny-llama"
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    assert not (folder / "pytorch_model.bin").exists()
    assert not (pull_dir / ".pulling" / "lockstep--tiny-llama").exists()
    models = (await (await client.get("/api/models")).json())["models"]
    (model,) = [m for m in models if m["path"] == str(folder)]
    assert model["format"] == "hf" and model["id"] == lines[-1]["model"]


@pytest.mark.parametrize(("body", "code", "kind", "text"), [
    ({"repo": "lockstep/nothing"}, 404, "pull_not_found", "no repository 'lockstep/nothing'"),
    ({"repo": "lockstep/small-gguf", "file": "big.gguf"}, 404, "pull_not_found", "its GGUF files: small.gguf"),
    ({"repo": "lockstep/small-gguf"}, 400, "pull_no_weights", "name one of its GGUF files: small.gguf"),
    ({"repo": "no-slash"}, 400, "invalid_request_error", "owner/name"),
    ({"repo": "a/b", "file": "../../etc/passwd"}, 400, "invalid_request_error", "inside the repo"),
    ({"file": "x"}, 400, "invalid_request_error", "repo"),
])
async def test_bad_pulls_are_json_errors_and_write_nothing(hub, client, pull_dir, body, code, kind, text):
    before = sorted(p.name for p in pull_dir.iterdir())
    resp = await client.post("/api/models/pull", json=body)
    err = (await resp.json())["error"]
    assert (resp.status, err["type"]) == (code, kind)
    assert text in err["message"]
    assert sorted(p.name for p in pull_dir.iterdir() if p.name != ".pulling") == before


async def test_offline_the_pull_says_so(client, monkeypatch, tmp_path, caplog):
    from studio.engine_child import free_port

    caplog.set_level(logging.WARNING, logger="huggingface_hub")

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    resp = await client.post("/api/models/pull", json={"repo": "lockstep/small-gguf", "file": "small.gguf"})
    err = (await resp.json())["error"]
    assert (resp.status, err["type"]) == (503, "hub_unreachable")
    assert "cannot reach the Hugging Face Hub" in err["message"] and "offline" in err["message"]
    # Said at once: huggingface_hub never started its retries with backoff (1+2+4+8+8 s).
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()], caplog.text


async def test_an_interrupted_pull_resumes_from_its_partial_file(hub, tmp_path):
    big = hub.repos["lockstep/small-gguf"] / "big.gguf"
    payload = bytes(range(256)) * (24 * 1024 * 1024 // 256)  # past huggingface_hub's 10 MiB chunks
    big.write_bytes(payload)
    hub.hold_after = 12 * 1024 * 1024
    seen: list[PullProgress] = []
    folder = tmp_path / "models"
    first = asyncio.ensure_future(pull("lockstep/small-gguf", "big.gguf", folder, seen.append))
    deadline = asyncio.get_running_loop().time() + 60
    while not any(p.completed > 0 for p in seen):
        assert asyncio.get_running_loop().time() < deadline, "no bytes arrived"
        await asyncio.sleep(0.02)
    first.cancel()
    hub.release.set()  # the next chunk arrives, and the cancelled transfer stops there
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not (folder / "lockstep--small-gguf" / "big.gguf").exists()

    hub.hold_after = None
    path = await pull("lockstep/small-gguf", "big.gguf", folder, seen.append)
    assert path.read_bytes() == payload
    resumed = [r for p, r in hub.ranges if p == "big.gguf"][-1]
    assert resumed is not None and int(resumed.split("=")[1].split("-")[0]) > 0, hub.ranges


async def test_the_models_screen_pulls_with_progress_and_lists_the_model(hub, tmp_path, pull_dir):
    from studio.tui.app import LockstepApp

    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([pull_dir], include_bundled=False),
                          env={}, logs=tmp_path / "logs")
    manager.store.update({"model_folders": [str(pull_dir)]})
    app = LockstepApp(manager, api=False)
    shown: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        banner = app.screen.query_one("#pull-banner")
        app.watch(app, "pull_progress", lambda p: shown.append(str(banner.render())) if p else None)
        await pilot.press("p", *"lockstep/small-gguf", "tab", *"small.gguf", "enter")
        deadline = asyncio.get_running_loop().time() + 60
        while not any(m.path.endswith("small.gguf") for m in app.models or []):
            assert asyncio.get_running_loop().time() < deadline, f"no pulled model; banner: {shown[-1:]}"
            await pilot.pause(0.05)
        assert "Pulled lockstep/small-gguf" in str(banner.render())
        assert any("MB/s" in s or "KB/s" in s or "B/s" in s for s in shown), shown
