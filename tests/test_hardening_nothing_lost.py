"""Issue 25, nothing lost: a refused load keeps the working model, settings survive every writer and
every damaged or unreachable file, the catalog and the engine refuse what they cannot read.

Against real `lockstep serve` processes and real engine children on the CPU backend; the TUI through
Textual's Pilot. Where this machine runs tests as root, permission bits do not stop reads, so an
unreadable path is one the kernel refuses even root here: a path through /proc/1/root (another
process's root, which needs ptrace rights over pid 1).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine_helpers import ROOT, engine_env, run_engine
from tests.studio_helpers import Studio, alive

CPU = ["--device", "cpu"]
DEADLINE_S = 60


def unreadable_path(tmp_path: Path, name: str) -> Path:
    """A path whose stat or read fails with EACCES for this test process."""
    if os.geteuid() != 0:
        target = tmp_path / f"{name}-locked"
        target.mkdir()
        target.chmod(0)
        return target
    target = Path("/proc/1/root/tmp")
    try:
        target.stat()
    except PermissionError:
        return target
    pytest.skip("running as root with rights over pid 1: no path here is unreadable")


@pytest.fixture
def studios(tmp_path):
    started = []

    def start(*args, config=None, **kw):
        s = Studio(config or tmp_path / "config", tmp_path / "logs", *args, **kw)
        started.append(s)
        return s.wait_ready()

    yield start
    for s in started:
        s.stop()


# --- 10: a refused or failed load never loses the working model without saying so -----------------

def test_a_refusal_known_from_the_flags_keeps_the_running_model(studios, tiny_llama):
    s = studios(models=tiny_llama.parent)
    code, first = s.call("POST", "/api/load", {"model": tiny_llama.name, "extra_args": CPU, "ctx_size": 1024})
    assert code == 200, first
    code, body = s.call("POST", "/api/load", {"model": tiny_llama.name, "exact_concurrency": "on", "ctx_size": 1024,
                                              "extra_args": CPU + ["-ctk", "q8_0"]})
    assert code == 422 and body["error"]["failure"] == "exact_refusal"
    assert "-ctk" in body["error"]["message"] or "--cache-type-k" in body["error"]["message"]
    assert f"{tiny_llama.name} is still loaded" in body["error"]["message"]
    status = s.call("GET", "/api/status")[1]
    assert (status["state"], status["pid"]) == ("ready", first["pid"]) and alive(first["pid"])
    code, models = s.call("GET", f"/v1/models/{tiny_llama.name}")  # answered by the running engine
    assert code == 200 and models["id"] == tiny_llama.name


def test_a_failed_replacement_says_the_previous_model_was_unloaded(studios, tiny_llama, tmp_path):
    folder = tmp_path / "models"
    shutil.copytree(tiny_llama, folder / tiny_llama.name)
    broken = folder / "broken-arch"
    shutil.copytree(tiny_llama, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "nonsense",
                                                    "architectures": ["NonsenseForCausalLM"]}))
    s = studios(models=folder)
    code, first = s.call("POST", "/api/load", {"model": tiny_llama.name, "extra_args": CPU, "ctx_size": 1024})
    assert code == 200, first
    code, body = s.call("POST", "/api/load", {"model": "broken-arch", "extra_args": CPU, "ctx_size": 1024})
    assert code == 422, body
    assert body["error"]["previous_unloaded"] == tiny_llama.name
    assert f"the previous model {tiny_llama.name} was unloaded" in body["error"]["message"]
    status = s.call("GET", "/api/status")[1]
    assert status["state"] == "failed" and "was unloaded" in status["error"]["message"]


# --- 11: two writers on one settings file ---------------------------------------------------------

def test_two_studios_on_one_config_folder_keep_each_others_settings(studios, tmp_path):
    a, b = studios(), studios()
    seen_by_b = b.call("GET", "/api/settings")[1]["version"]
    code, _ = a.call("PUT", "/api/settings", {"model_folders": [str(tmp_path / "a-models")]})
    assert code == 200
    code, body = b.call("PUT", "/api/settings", {"exact_concurrency": "on"})
    assert code == 200
    on_disk = json.loads((tmp_path / "config" / "settings.json").read_text())
    assert on_disk["model_folders"] == [str(tmp_path / "a-models")] and on_disk["exact_concurrency"] == "on"
    assert body["settings"]["model_folders"] == [str(tmp_path / "a-models")]
    # A writer that names the version it read is refused once the file moved on.
    before = (tmp_path / "config" / "settings.json").read_bytes()
    code, body = b.call("PUT", "/api/settings", {"model_folders": []}, headers={"If-Match": f'"{seen_by_b}"'})
    assert code == 409 and body["error"]["type"] == "settings_conflict"
    assert (tmp_path / "config" / "settings.json").read_bytes() == before
    current = b.call("GET", "/api/settings")[1]["version"]
    code, _ = b.call("PUT", "/api/settings", {"preempt_mode": "park"}, headers={"If-Match": current})
    assert code == 200


def test_concurrent_writers_lose_no_write(studios, tmp_path):
    a, b = studios(), studios()
    import threading

    def hammer(s, field, values):
        for v in values:
            assert s.call("PUT", "/api/settings", {"load": {field: v}})[0] == 200

    threads = [threading.Thread(target=hammer, args=(a, "ctx_size", range(1000, 1020))),
               threading.Thread(target=hammer, args=(b, "parallel", range(1, 21)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    load = json.loads((tmp_path / "config" / "settings.json").read_text())["load"]
    assert (load["ctx_size"], load["parallel"]) == (1019, 20)


async def test_the_tui_settings_screen_refuses_a_stale_save(tmp_path, monkeypatch):
    from settings import SettingsStore
    from studio.catalog import Catalog
    from studio.manager import LoadManager
    from studio.tui.app import LockstepApp

    config = tmp_path / "config"
    manager = LoadManager(SettingsStore(config), catalog=Catalog([], include_bundled=False), env={},
                          logs=tmp_path / "logs")
    app = LockstepApp(manager, api=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f7")
        screen = app.screen
        # Another studio (a real process on the same folder) changes the folders through its REST API.
        other = Studio(config, tmp_path / "logs2").wait_ready()
        try:
            assert other.call("PUT", "/api/settings", {"model_folders": ["/from/rest"]})[0] == 200
        finally:
            other.stop()
        screen.query_one("#set-exact").value = "on"
        await pilot.press("ctrl+s")
        error = screen.query_one("#settings-error")
        deadline = time.monotonic() + 10
        while not error.display:
            assert time.monotonic() < deadline, "no refusal shown"
            await pilot.pause(0.05)
        text = str(error.render())
        assert "changed since" in text and "ctrl+r" in text
        on_disk = json.loads((config / "settings.json").read_text())
        assert on_disk["model_folders"] == ["/from/rest"] and on_disk.get("exact_concurrency") is None
        await pilot.press("ctrl+r")  # reload, then the save goes through over the current file
        assert screen.query_one("#set-folders").text == "/from/rest"
        screen.query_one("#set-exact").value = "on"
        await pilot.press("ctrl+s")
        deadline = time.monotonic() + 10
        while json.loads((config / "settings.json").read_text()).get("exact_concurrency") != "on":
            assert time.monotonic() < deadline, "the reloaded save did not land"
            await pilot.pause(0.05)
        assert json.loads((config / "settings.json").read_text())["model_folders"] == ["/from/rest"]


# --- 12: unknown keys, newer files, read-only and unreachable settings -----------------------------

def test_unknown_keys_and_a_newer_schema_keep_the_known_settings(studios, tmp_path, tiny_llama):
    config = tmp_path / "config"
    config.mkdir()
    original = {"schema_version": 2, "model_folders": [str(tiny_llama.parent)], "preempt_mode": "park",
                "future": {"anything": [1, 2]}, "load": {"ctx_size": 2048, "new_knob": True}}
    (config / "settings.json").write_text(json.dumps(original))
    s = studios()
    body = s.call("GET", "/api/settings")[1]
    assert body["settings"]["model_folders"] == [str(tiny_llama.parent)]
    assert (body["settings"]["preempt_mode"], body["settings"]["load"]["ctx_size"]) == ("park", 2048)
    problems = " ".join(body["problems"])
    assert "future" in problems and "load.new_knob" in problems and "schema_version" in problems
    assert tiny_llama.name in [m["id"] for m in s.call("GET", "/api/models")[1]["models"]]
    assert s.call("PUT", "/api/settings", {"exact_concurrency": "on"})[0] == 200
    written = json.loads((config / "settings.json").read_text())
    assert written["future"] == {"anything": [1, 2]} and written["load"]["new_knob"] is True
    assert written["schema_version"] == 2 and written["exact_concurrency"] == "on"
    assert not list(config.glob("settings.json.corrupt-*"))


def test_a_read_only_settings_file_stays_read_only(studios, tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    path = config / "settings.json"
    path.write_text(json.dumps({"preempt_mode": "park"}))
    path.chmod(0o444)
    before = path.read_bytes()
    s = studios()
    code, body = s.call("PUT", "/api/settings", {"exact_concurrency": "on"})
    assert code == 409 and "read-only" in body["error"]["message"]
    assert path.read_bytes() == before and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert s.call("GET", "/api/settings")[1]["settings"]["preempt_mode"] == "park"


def _as_directory(config: Path) -> None:
    (config / "settings.json").mkdir(parents=True)


def _deeply_nested(config: Path) -> None:
    config.mkdir()
    (config / "settings.json").write_text("[" * 200_000 + "]" * 200_000)


def _unreadable(config: Path) -> None:
    config.mkdir()
    target = unreadable_path(config.parent, "settings")
    (config / "settings.json").symlink_to(target / "settings.json")


@pytest.mark.parametrize("make", [_as_directory, _deeply_nested, _unreadable])
def test_start_up_survives_a_settings_file_it_cannot_use_and_writes_nothing(studios, tmp_path, make):
    config = tmp_path / "config"
    make(config)
    before = sorted(p.name for p in config.iterdir())
    s = studios()
    body = s.call("GET", "/api/settings")[1]
    assert body["settings"]["api"]["port"] == 8765 and len(body["problems"]) == 1
    assert "Traceback" not in s.output() and "settings.json" in s.output()
    assert sorted(p.name for p in config.iterdir() if p.name != ".settings.json.lock") == before
    code, answer = s.call("PUT", "/api/settings", {"exact_concurrency": "on"})
    if make is _deeply_nested:
        assert code == 200 and len(list(config.glob("settings.json.corrupt-*"))) == 1  # kept aside, then saved
    else:
        assert code == 409 and "not saved" in answer["error"]["message"]
        assert sorted(p.name for p in config.iterdir() if p.name != ".settings.json.lock") == before


def test_a_settings_folder_that_cannot_be_written_is_a_clear_refusal(studios):
    s = studios(config=Path("/sys/lockstep-hardening-test"))
    assert s.call("GET", "/api/settings")[1]["problems"] == []
    code, body = s.call("PUT", "/api/settings", {"exact_concurrency": "on"})
    assert code == 409 and body["error"]["type"] == "settings_not_writable"
    assert "/sys/lockstep-hardening-test" in body["error"]["message"]


# --- 13: unreadable model folders and non-regular model files --------------------------------------

def test_an_unreadable_model_directory_is_skipped_and_named(studios, tmp_path, tiny_llama):
    folder = tmp_path / "models"
    shutil.copytree(tiny_llama, folder / tiny_llama.name)
    (folder / "locked").symlink_to(unreadable_path(tmp_path, "model"))
    s = studios(models=folder)
    code, body = s.call("GET", "/api/models")
    assert code == 200 and tiny_llama.name in [m["id"] for m in body["models"]]
    assert any("locked" in p and "cannot be read" in p for p in body["problems"])
    code, body = s.call("POST", "/api/load", {"model": "no-such-model"})
    assert code == 404 and body["error"]["type"] == "model_not_found"


def test_a_fifo_as_the_model_is_refused_by_the_engine(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    done = run_engine(["-m", str(fifo), "--device", "cpu", "--port", "0"], timeout=DEADLINE_S)
    assert done.returncode == 4, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: model load failed: {fifo}: a FIFO, not a model file or directory"


def test_a_fifo_inside_a_model_folder_does_not_hang_the_catalog(studios, tmp_path, tiny_llama):
    folder = tmp_path / "models"
    model = folder / "fifo-model"
    model.mkdir(parents=True)
    shutil.copy(tiny_llama / "config.json", model / "config.json")
    os.mkfifo(model / "model.safetensors")
    s = studios(models=folder)
    code, body = s.call("GET", "/api/models", timeout=DEADLINE_S)
    assert code == 200
    (entry,) = [m for m in body["models"] if m["id"] == "fifo-model"]
    assert "not a regular file" in entry["error"]
    done = run_engine(["-m", str(model), "--device", "cpu", "--port", "0"], timeout=DEADLINE_S)
    assert done.returncode == 4 and "not a regular file" in done.stderr.strip().splitlines()[-1]


# --- 14: a busy port -------------------------------------------------------------------------------

def test_a_second_studio_on_a_busy_port_says_so_in_one_line(studios, tmp_path):
    first = studios()
    env = {k: v for k, v in engine_env().items() if not k.startswith("LOCKSTEP_API")}
    env.update(LOCKSTEP_CONFIG_DIR=str(tmp_path / "config"), LOCKSTEP_LOG_DIR=str(tmp_path / "logs"))
    done = subprocess.run([sys.executable, "-m", "studio", "serve", "--port", str(first.port)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 2
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert lines == [f"lockstep: cannot listen on 127.0.0.1:{first.port}: the address is in use (another lockstep?)"]
    assert first.call("GET", "/api/status")[0] == 200
