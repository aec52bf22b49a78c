"""The TUI's pure parts (form checks, the SSE client, option parsing) and its behaviour without an engine."""

from __future__ import annotations

import json
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from settings import LoadDefaults, SettingsStore
from studio.catalog import Catalog, ModelInfo
from studio.manager import LoadManager
from studio.tui.app import LockstepApp, order_models
from studio.tui.chat_stream import ChatError, printable, stream_chat
from studio.tui.load_form import check_load_form, form_values
from studio.tui.messages import settings_saved
from studio.tui.screens.chat import sampling
from studio.tui.screens.settings import settings_patch
from studio.tui.widgets.chat_message import ChatMessage

SIZE = (120, 40)


def check(env=None, stored=None, native=None, **values):
    base = {"model": "tiny", **form_values(LoadDefaults()), "exact": "default"}
    base.update(values)
    return check_load_form(base, defaults=LoadDefaults(), stored_exact=stored, env=env or {}, native_context=native)


# the Load form's checks ---------------------------------------------------------------------------


def test_defaults_make_a_valid_request():
    result = check()
    assert result.ok and result.request.model == "tiny" and result.request.exact_concurrency is None
    assert result.exact.value == "off" and result.exact.source == "default"
    assert result.warnings == []


@pytest.mark.parametrize("field, text", [("ctx_size", "4k"), ("parallel", "0"), ("parallel", "-2"),
                                         ("batch_size", "1.5"), ("spec_draft_n_max", "999")])
def test_bad_numbers_are_named_on_their_field(field, text):
    result = check(**{field: text})
    assert not result.ok and field in result.errors


def test_blank_gpu_layers_means_the_engine_default():
    assert check(n_gpu_layers="").ok


@pytest.mark.parametrize("extra, says", [("--port 9000", "--port"), ("-m other.gguf", "-m"), ("--bogus", "unknown"),
                                         ("-c", "needs a value"), ("'unclosed", "cannot split")])
def test_extra_args_are_checked_like_a_load(extra, says):
    result = check(extra_args=extra)
    assert not result.ok and says in result.errors["extra_args"]


def test_exact_contradictions_warn_before_loading():
    result = check(exact="on", extra_args="-ctk q8_0 --context-shift")
    assert result.ok
    joined = " ".join(result.warnings)
    assert "quantized KV cache" in joined and "context shift" in joined


def test_contradictions_are_silent_with_exact_off():
    assert check(exact="off", extra_args="-ctk q8_0").warnings == []


def test_environment_override_is_shown():
    result = check(env={"LOCKSTEP_EXACT_CONCURRENCY": "off"}, exact="on")
    assert result.exact.value == "off" and result.exact.source == "env"
    assert any("outranks" in w for w in result.warnings)


def test_stored_exact_is_the_default_choice():
    result = check(stored="auto")
    assert result.exact.value == "auto" and "stored in Settings" in result.exact_text()


def test_bad_environment_value_is_an_error():
    assert "exact" in check(env={"LOCKSTEP_EXACT_CONCURRENCY": "maybe"}).errors


def test_context_beyond_native_warns():
    assert any("native context 2048" in w for w in check(ctx_size="8192", native=2048).warnings)


# small parsers ------------------------------------------------------------------------------------


def test_sampling_options():
    assert sampling("", "256", "") == ({"max_tokens": 256}, None)
    assert sampling("0.7", "", "42") == ({"temperature": 0.7, "seed": 42}, None)
    assert sampling("hot", "", "")[1] is not None
    assert sampling("", "0", "")[1] is not None


def test_settings_patch():
    values = {"exact": "unset", "preempt": "park", "folders": " /a \n\n/b\n", "api_host": "127.0.0.1",
              "api_port": "8765", "api_key": "", "health_timeout": "60", "auto_load": "on", "threads": "auto"}
    patch, errors = settings_patch(values)
    assert errors == {}
    assert patch["exact_concurrency"] is None and patch["preempt_mode"] == "park" and patch["auto_load"] is True
    assert patch["model_folders"] == ["/a", "/b"] and patch["api"] == {"host": "127.0.0.1", "api_key": None,
                                                                       "port": 8765}
    assert patch["load"] == {"threads": "auto"}
    assert "api_port" in settings_patch({**values, "api_port": "http"})[1]
    assert settings_patch({**values, "threads": " 4 "})[0]["load"] == {"threads": 4}
    assert "expects 'auto'" in settings_patch({**values, "threads": "0"})[1]["threads"]


def test_printable_keeps_text_and_neutralises_controls():
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("\x1b[2J\x07\x00") == "\u241b[2J\u2407\u2400"
    assert printable("\x9b") == "\ufffd"


def test_bundled_model_comes_first(monkeypatch, tmp_path):
    monkeypatch.setattr("studio.tui.app.bundled_models_dir", lambda: tmp_path / "bundled")
    models = [ModelInfo(id="a", path="/x/a", format="hf"), ModelInfo(id="d", path=str(tmp_path / "bundled" / "d"),
                                                                  format="hf")]
    assert [m.id for m in order_models(models)] == ["d", "a"]


# the SSE client -----------------------------------------------------------------------------------


def sse(*chunks) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def delta(text, finish=None):
    return {"seed": 7, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


async def collect(handler):
    """What stream_chat yields from a real HTTP server that answers with `handler`."""
    import aiohttp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            return [p async for p in stream_chat(session, str(server.make_url("")).rstrip("/"), {"messages": []})]
    finally:
        await server.close()


async def test_stream_chat_yields_each_piece():
    async def handler(request):
        assert (await request.json())["stream"] is True
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(delta("Hel"), delta("lo"), delta("", "stop"), b"[DONE]"))
        return resp

    pieces = await collect(handler)
    assert [p.text for p in pieces] == ["Hel", "lo", ""] and pieces[-1].finish_reason == "stop"
    assert pieces[0].seed == 7


async def test_stream_chat_reports_the_engine_error():
    async def handler(request):
        return web.json_response({"error": {"code": 400, "type": "invalid_request_error",
                                            "message": "'max_tokens' must be positive"}}, status=400)

    with pytest.raises(ChatError, match="max_tokens' must be positive.*HTTP 400"):
        await collect(handler)


async def test_stream_chat_reports_an_error_event():
    async def handler(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(sse(delta("a"), {"error": {"type": "server_error", "message": "slot died"}}))
        return resp

    with pytest.raises(ChatError, match="slot died"):
        await collect(handler)


# the app without an engine ------------------------------------------------------------------------


@pytest.fixture
def offline_app(tmp_path):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([], include_bundled=False), env={},
                          logs=tmp_path / "logs")
    return LockstepApp(manager, api=False)


# A bound on a hang, not a speed check: at a load average of ~4.5 on two cores the 10 s this was ran out
# (an app's first catalog scan and the Load screen's off-screen build wait behind the other work).
WAIT_S = 120.0


async def wait(pilot, predicate, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def test_empty_catalog_shows_the_hint(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await wait(pilot, lambda: offline_app.models is not None, "the scan")
        hint = offline_app.screen.query_one("#catalog-hint")
        assert hint.display and "No models found" in str(hint.render())


async def test_chat_without_a_model_says_so_inline(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f4", *"hi", "enter")
        screen = offline_app.screen
        await wait(pilot, lambda: bool(screen.query(".-error")), "the inline error")
        error = screen.query(".-error").last(ChatMessage)
        assert "No model is loaded" in error.text
        assert screen.conversation == [] and not screen.query(".-assistant")


async def test_exactness_check_without_a_model_says_so(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f5", "r")
        summary = offline_app.screen.query_one("#exactness-summary")
        await wait(pilot, lambda: summary.has_class("-bad"), "the verdict")
        assert "load a model first" in str(summary.render())


async def test_load_form_refuses_an_owned_flag_live(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        screen = offline_app.screen
        screen.query_one("#field-extra_args").value = "--port 9000"
        await pilot.pause()
        assert "may not set --port" in str(screen.query_one("#help-extra_args").render())
        assert screen.query_one("#load-button").disabled


async def test_settings_are_saved_through_the_store(offline_app, tmp_path):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f7")
        screen = offline_app.screen
        screen.query_one("#set-exact").value = "on"
        screen.query_one("#set-auto_load").value = "on"
        screen.query_one("#set-folders").text = str(tmp_path / "more-models")
        await pilot.press("ctrl+s")
        store_file = tmp_path / "config" / "settings.json"
        await wait(pilot, lambda: store_file.exists() and '"on"' in store_file.read_text(), "the saved file")
        saved = json.loads(store_file.read_text())
        assert saved["exact_concurrency"] == "on" and saved["model_folders"] == [str(tmp_path / "more-models")]
        assert saved["auto_load"] is True
        assert "in effect: on" in str(screen.query_one("#help-exact").render())


async def test_settings_refuse_a_bad_port(offline_app, tmp_path):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f7")
        screen = offline_app.screen
        screen.query_one("#set-api_port").value = "99999"
        await pilot.press("ctrl+s")
        error = screen.query_one("#settings-error")
        await wait(pilot, lambda: error.display, "the inline refusal")
        assert "port" in str(error.render())
        assert not (tmp_path / "config" / "settings.json").exists()


async def test_settings_changed_by_another_writer_are_not_overwritten(offline_app, tmp_path):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f7")
        screen = offline_app.screen
        await offline_app.workers.wait_for_complete()  # the visit's own look at the file is done
        await pilot.pause()
        SettingsStore(tmp_path / "config").update({"exact_concurrency": "off"})  # another studio, after reading
        screen.query_one("#set-exact").value = "on"
        await pilot.press("ctrl+s")
        error = screen.query_one("#settings-error")
        await wait(pilot, lambda: error.display, "the inline refusal")
        assert "changed since it was read" in str(error.render()) and "ctrl+r" in str(error.render())
        assert json.loads((tmp_path / "config" / "settings.json").read_text())["exact_concurrency"] == "off"


def test_a_settings_update_says_why_it_failed(tmp_path):
    store = SettingsStore(tmp_path / "config")
    assert settings_saved(lambda: store.update({"exact_concurrency": "on"})).error is None
    bad = settings_saved(lambda: store.update({"api_port": 99999})).error
    assert bad is not None and bad.startswith("api_port: "), bad
    assert settings_saved(lambda: (_ for _ in ()).throw(OSError("disk full"))).error == "disk full"
    assert store.settings.exact_concurrency == "on"
    stale = store.version
    SettingsStore(tmp_path / "config").update({"exact_concurrency": "off"})  # another writer
    conflict = settings_saved(lambda: store.update({"preempt_mode": "park"}, expected_version=stale), "; revert").error
    assert conflict.startswith("settings file") and conflict.endswith("try again; revert"), conflict
    store.path.unlink()
    store.path.mkdir()  # a settings file that cannot be written: an answer too, not an exception
    unwritable = settings_saved(lambda: store.update({"exact_concurrency": "on"}), "; revert").error
    assert unwritable is not None and "cannot be read" in unwritable and "revert" not in unwritable, unwritable


async def test_saving_load_defaults_to_an_unwritable_file_says_so_and_the_app_stays(tmp_path, tiny_llama):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([tiny_llama.parent], include_bundled=False),
                          env={}, logs=tmp_path / "logs")
    app = LockstepApp(manager, api=False)
    notes = []
    app.notify = lambda message, **_: notes.append(str(message))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        await wait(pilot, lambda: app.selected_model and app.screen.query_one("#field-model").value == app.selected_model,
                   "the form filled with a model")
        (tmp_path / "config" / "settings.json").mkdir(parents=True)  # unreadable, so nothing may be written
        await pilot.press("ctrl+s")
        await wait(pilot, lambda: any("not saved" in n for n in notes), "the answer")
        note = next(n for n in notes if "not saved" in n)
        assert note.startswith("not saved: ") and "cannot be read" in note, notes
        assert app.is_running and app.return_code is None


async def test_returning_to_chat_focuses_the_prompt(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        assert offline_app.focused.id == "prompt"
        await pilot.press("tab", "f3")
        assert offline_app.current_mode == "status"
        await pilot.press("f4")
        assert offline_app.focused.id == "prompt"
        await pilot.press("escape", "f1")
        assert offline_app.current_mode == "models"


async def test_function_keys_switch_screens_from_inside_a_field_without_typing(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        field = offline_app.screen.query_one("#field-extra_args")
        field.focus()
        await pilot.press("1", "3", "u")
        assert offline_app.current_mode == "load" and field.value.endswith("13u")  # typed, as in any field
        typed = field.value
        await pilot.press("f3")
        assert offline_app.current_mode == "status"
        await pilot.press("alt+4")
        assert offline_app.current_mode == "chat"
        await pilot.press(*"hi", "f2")
        assert offline_app.current_mode == "load" and field.value == typed  # nothing injected


async def test_q_quits_at_once_without_a_model(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait(pilot, lambda: offline_app.return_code is not None, "the app to exit")


async def test_q_in_a_field_is_typed_not_a_quit(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f4", "q")
        await pilot.pause()
        assert offline_app.return_code is None and offline_app.screen.query_one("#prompt").value == "q"


def test_a_context_beyond_what_the_slots_may_share_is_refused_in_the_form():
    result = check(ctx_size="16777216", parallel="1", native=1024)
    assert not result.ok and "native context: 1024 tokens a chat" in result.errors["ctx_size"]
    assert check(ctx_size="4096", parallel="4", native=1024).ok


def test_tui_defaults_are_one_slot_at_the_native_context_unless_defaults_are_stored():
    from studio.tui.load_form import effective_defaults

    assert (effective_defaults(LoadDefaults(), 1024).parallel, effective_defaults(LoadDefaults(), 1024).ctx_size) \
        == (1, 1024)
    stored = LoadDefaults(parallel=2, ctx_size=8192)
    assert (effective_defaults(stored, 1024).parallel, effective_defaults(stored, 1024).ctx_size) == (2, 1024)
    assert effective_defaults(LoadDefaults(parallel=2, ctx_size=512), 1024).ctx_size == 512


def test_status_rate_is_what_runs_now_not_the_last_finished_request():
    from studio.tui.screens.status import live_rate, rate_text, running

    slots_a = [{"task": 7, "is_processing": True, "generated": 10}, {"task": -1, "is_processing": False}]
    slots_b = [{"task": 7, "is_processing": True, "generated": 40}, {"task": -1, "is_processing": False}]
    rate = live_rate((1.0, running(slots_a)), (2.0, running(slots_b)))
    assert rate == 30.0
    busy = {"slots": slots_b, "tokens_per_second": 812.4}
    assert rate_text(busy, rate) == "generating 30.0 tokens/s"
    assert rate_text({"slots": [], "tokens_per_second": 812.4}, None) == "idle (last requests 812.4 tokens/s)"


def test_the_exactness_verdict_says_when_the_loaded_engine_is_not_exact():
    from studio.tui.screens.exactness import loaded_note

    assert "runs EXACT OFF" in loaded_note({"state": "ready", "exact_concurrency": "off"})
    assert loaded_note({"state": "ready", "exact_concurrency": "on"}) == ""


async def test_each_studio_logs_to_its_own_folder_and_the_logs_screen_names_it(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("LOCKSTEP_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("LOCKSTEP_CONFIG_DIR", str(tmp_path / "config"))
    app = LockstepApp(api=False)
    folder = app.manager.log_dir
    assert folder.parent == tmp_path / "logs" and folder.name.endswith(f"-{os.getpid()}")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f6")
        assert str(folder) in str(app.screen.query_one("#log-folder").render())
        log = app.screen.query_one("#log-text")
        log.clear()
        log.write("x" * 500)  # a long engine line wraps onto several lines instead of being cut
        await pilot.pause()
        assert len(log.lines) >= 3


def test_the_load_banner_shows_the_phase_the_memory_plan_and_the_latest_line(tmp_path):
    from studio.load_progress import read_progress
    from studio.tui.widgets.load_banner import describe

    log = tmp_path / "engine-attempt1.log"
    log.write_text("# lockstep attempt 1 of at most 4\n"
                   "INFO engine.launch: memory: needs 0.05 GiB (weights 0.02, kv 0.03), 20.00 GiB free\n"
                   "INFO engine.load: load progress: phase=weights tensors=3/21 bytes=1048576/4194304\n"
                   "WARNING engine.loader: text only; 4 tensors of the vision tower are not loaded [x]\n")
    progress = read_progress(log)
    assert (progress["phase"], progress["tensors"], progress["n_bytes"]) == ("weights", 3, 4194304)
    lines = describe(progress).splitlines()
    assert lines[0] == "storing the weights: 3/21 tensors, 1.0 MiB of 4.0 MiB"
    assert lines[1] == "memory: needs 0.05 GiB (weights 0.02, kv 0.03), 20.00 GiB free"
    assert lines[2].startswith("engine: WARNING engine.loader: text only")
    assert read_progress(tmp_path / "missing.log") is None and describe(None) == ""


async def test_the_load_form_follows_an_exact_setting_saved_on_the_settings_screen(offline_app):
    async with offline_app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        assert "off (built-in default)" in str(offline_app.screen.query_one("#load-exact").render())
        await pilot.press("f7")
        offline_app.screen.query_one("#set-exact").value = "on"
        await pilot.press("ctrl+s")
        store = offline_app.manager.store
        await wait(pilot, lambda: store.settings.exact_concurrency == "on", "the saved setting")
        await pilot.press("f2")
        text = str(offline_app.screen.query_one("#load-exact").render())
        assert "requested as on (the default stored in Settings)" in text, text


async def test_the_load_screen_is_built_before_its_first_visit_and_filled_by_the_scan(tmp_path, tiny_llama):
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([tiny_llama.parent], include_bundled=False),
                          env={}, logs=tmp_path / "logs")
    app = LockstepApp(manager, api=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait(pilot, lambda: app.models is not None and "load" in app._screen_stacks, "the scan and the prebuild")
        (built,) = app._screen_stacks["load"]
        await wait(pilot, lambda: built.is_mounted, "the off-screen mount")
        # the session's model folder may hold other tiny models: the form shows the one selected
        assert tiny_llama.name in [m.id for m in app.models] and app.selected_model is not None
        await wait(pilot, lambda: built.query_one("#field-model").value == app.selected_model,
                   "the form to follow the scan")
        await pilot.press("f2")
        assert app.screen is built and not built.query_one("#load-button").disabled


async def test_a_first_visit_does_not_restyle_the_whole_app(offline_app, monkeypatch):
    calls = []
    real = LockstepApp.refresh_css
    monkeypatch.setattr(LockstepApp, "refresh_css", lambda self, animate=True: (calls.append(1), real(self, animate)))
    async with offline_app.run_test(size=SIZE) as pilot:
        await wait(pilot, lambda: offline_app.css_refreshed_at is not None, "the first styling")
        before = len(calls)
        for key in ("f3", "f4", "f7"):
            await pilot.press(key)
            await pilot.pause()
        assert len(calls) == before, "switching to a new screen re-parsed and re-applied every stylesheet"
