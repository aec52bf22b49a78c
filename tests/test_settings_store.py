"""The settings store on disk: restart survival, atomic writes, damaged files kept aside."""

import json
import os

import pytest
from pydantic import ValidationError

from settings import (
    LoadDefaults,
    LoadRequest,
    Settings,
    SettingsError,
    SettingsStore,
    apply_env_overrides,
    config_dir,
    log_dir,
)
from settings.env import EnvOverrideError


def test_missing_file_gives_defaults_and_writes_nothing(tmp_path):
    store = SettingsStore(tmp_path)
    assert store.settings == Settings()
    assert store.problems == []
    assert list(tmp_path.iterdir()) == []


def test_settings_survive_a_restart(tmp_path):
    store = SettingsStore(tmp_path)
    store.update({"exact_concurrency": "on", "preempt_mode": "park", "model_folders": ["/models"],
                  "load": {"ctx_size": 8192, "extra_args": ["--jinja"]}, "api": {"port": 9000}})
    again = SettingsStore(tmp_path)
    assert again.settings.exact_concurrency == "on"
    assert again.settings.preempt_mode == "park"
    assert again.settings.model_folders == ["/models"]
    assert again.settings.load.ctx_size == 8192
    assert again.settings.load.extra_args == ["--jinja"]
    assert again.settings.load.parallel == LoadDefaults().parallel  # untouched fields keep their defaults
    assert again.settings.api.port == 9000
    assert again.problems == []


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    store = SettingsStore(tmp_path)
    store.update({"exact_concurrency": "auto"})
    store.update({"exact_concurrency": "off"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".settings.json.lock", "settings.json"]
    assert json.loads((tmp_path / "settings.json").read_text())["exact_concurrency"] == "off"


def test_invalid_update_writes_nothing(tmp_path):
    store = SettingsStore(tmp_path)
    store.update({"exact_concurrency": "on"})
    before = (tmp_path / "settings.json").read_bytes()
    with pytest.raises(ValidationError):
        store.update({"exact_concurrency": "sometimes"})
    with pytest.raises(ValidationError):
        store.update({"load": {"ctx_size": -1}})
    assert (tmp_path / "settings.json").read_bytes() == before
    assert store.settings.exact_concurrency == "on"


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    store = SettingsStore(tmp_path)
    store.update({"exact_concurrency": "on"})

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(SettingsError, match="disk full"):
        store.update({"exact_concurrency": "off"})
    monkeypatch.undo()
    assert SettingsStore(tmp_path).settings.exact_concurrency == "on"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".settings.json.lock", "settings.json"]


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe\x00garbage", b"[1, 2, 3]"])
def test_damaged_file_is_reported_left_alone_and_kept_aside_at_the_next_save(tmp_path, content):
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    store = SettingsStore(tmp_path)
    assert store.settings == Settings()
    (problem,) = store.problems
    assert problem.kind == "damaged" and "damaged" in problem.message() and problem.moved_to is None
    assert path.read_bytes() == content and sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]
    store.update({"exact_concurrency": "on"})
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("settings.json.corrupt-")]
    assert [str(p) for p in kept] == [store.problems[0].moved_to]
    assert kept[0].read_bytes() == content  # the user's bytes are kept, not rewritten
    assert store.problems[0].moved_to in store.problems[0].message()


@pytest.mark.parametrize(("content", "named"), [
    (b'{"exact_concurrency": "sometimes", "preempt_mode": "park"}', "exact_concurrency"),
    (b'{"load": {"ctx_size": "big", "parallel": 2}, "preempt_mode": "park"}', "load.ctx_size"),
    (b'{"unknown_setting": 1, "preempt_mode": "park"}', "unknown_setting"),
])
def test_a_bad_field_costs_only_itself_and_stays_in_the_file(tmp_path, content, named):
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    store = SettingsStore(tmp_path)
    assert store.settings.preempt_mode == "park"
    (problem,) = store.problems
    assert named in problem.message()
    store.update({"exact_concurrency": "on"} if named != "exact_concurrency" else {"health_timeout_s": 5})
    written = json.loads(path.read_text())
    assert written["preempt_mode"] == "park"
    original = json.loads(content)
    key = named.split(".")[0]
    assert written[key] == original[key] if key != "load" else written["load"]["ctx_size"] == "big"


def test_saving_after_a_damaged_file_does_not_touch_the_kept_copy(tmp_path):
    (tmp_path / "settings.json").write_text("{oops")
    store = SettingsStore(tmp_path)
    store.update({"exact_concurrency": "on"})
    store.update({"exact_concurrency": "off"})
    (kept,) = tmp_path.glob("settings.json.corrupt-*")
    assert kept.read_text() == "{oops"
    assert SettingsStore(tmp_path).settings.exact_concurrency == "off"


def test_two_damaged_files_in_one_second_are_both_kept(tmp_path):
    (tmp_path / "settings.json").write_text("{first")
    first = SettingsStore(tmp_path)
    first.update({})
    (tmp_path / "settings.json").write_text("{second")
    second = SettingsStore(tmp_path)
    second.update({})
    assert first.problems[0].moved_to != second.problems[0].moved_to
    assert sorted(p.read_text() for p in tmp_path.glob("settings.json.corrupt-*")) == ["{first", "{second"]


def test_config_and_log_dirs_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOCKSTEP_LOG_DIR", str(tmp_path / "logs"))
    assert config_dir() == tmp_path / "cfg"
    assert log_dir() == tmp_path / "logs"
    assert SettingsStore().path == tmp_path / "cfg" / "settings.json"


def test_dirs_default_to_platformdirs():
    cfg, logs = config_dir({}), log_dir({})
    assert cfg.name == "lockstep" or "lockstep" in cfg.parts
    assert "lockstep" in logs.parts


def test_env_overrides_apply_without_being_stored(tmp_path):
    store = SettingsStore(tmp_path)
    store.update({"api": {"port": 9000}, "model_folders": ["/a"]})
    env = {"LOCKSTEP_API_PORT": "9100", "LOCKSTEP_API_HOST": "0.0.0.0", "LOCKSTEP_API_KEY": "k",
           "LOCKSTEP_MODEL_DIRS": os.pathsep.join(["/b", "/a"])}
    effective, applied = apply_env_overrides(store.settings, env)
    assert (effective.api.port, effective.api.host, effective.api.api_key) == (9100, "0.0.0.0", "k")
    assert effective.model_folders == ["/a", "/b"]
    assert sorted(applied) == sorted(env)
    assert SettingsStore(tmp_path).settings.api.port == 9000


def test_bad_env_override_is_reported():
    with pytest.raises(EnvOverrideError, match="LOCKSTEP_API_PORT"):
        apply_env_overrides(Settings(), {"LOCKSTEP_API_PORT": "eighty"})
    with pytest.raises(EnvOverrideError):
        apply_env_overrides(Settings(), {"LOCKSTEP_API_PORT": "70000"})


def test_load_request_takes_defaults_for_unset_fields():
    defaults = LoadDefaults(ctx_size=2048, extra_args=["--jinja"])
    merged = LoadRequest(model="m", parallel=8, batch=64, ubatch=32).with_defaults(defaults)
    assert (merged.ctx_size, merged.parallel, merged.batch_size, merged.ubatch_size) == (2048, 8, 64, 32)
    assert merged.extra_args == ["--jinja"]
    assert LoadRequest(model="m", extra_args=[]).with_defaults(defaults).extra_args == []


@pytest.mark.parametrize("body", [
    {"model": ""},
    {"model": "m", "exact_concurrency": "maybe"},
    {"model": "m", "cache_type_k": "q3"},
    {"model": "m", "parallel": 0},
    {"model": "m", "surprise": 1},
    {"model": "m", "flash_attn": "sometimes"},
])
def test_load_request_rejects_bad_fields(body):
    with pytest.raises(ValidationError):
        LoadRequest.model_validate(body)


def test_settings_imports_neither_studio_nor_engine():
    import subprocess
    import sys

    code = ("import sys, settings; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('studio', 'engine')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
