"""SVG snapshots of the studio's screens at 120x40 (and 80x24, where nothing may be cut).

Screens that show no engine (an empty catalog, Status with nothing loaded) run over the real LoadManager,
settings store and catalog. The others run over stand-ins, named Fake*, for what a real engine child on
this CPU cannot give twice alike or at all: a catalog of GPU-sized models that are not on this machine
(a 1B BF16 folder, a Q8_0 GGUF), and a loaded engine's port, pid, argv, tokens/s, page use, parks and
log lines, which change from run to run while a snapshot must render the same pixels. Their behaviour
with the real engine (loading, the badge, streaming, the exactness check, logs) is what the Pilot tests
in test_tui_pilot.py, test_tui_chat.py and test_studio_load_progress.py check. Update after a deliberate
change with `pytest tests/test_tui_snapshots.py --snapshot-update` and look at the SVGs before committing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from settings import Settings, SettingsStore
from studio.catalog import Catalog, ModelInfo
from studio.evidence import Cell, Report
from studio.manager import LoadManager
from studio.tui.app import LockstepApp
from studio.tui.messages import LoadOutcome

SIZE = (120, 40)
SMALL = (80, 24)  # the smallest terminal a screen must fit without cutting text
BUNDLED = Path("/opt/lockstep/assets/models")

MODELS = [
    ModelInfo(id="lockstep-pycode-13m", path=str(BUNDLED / "lockstep-pycode-13m"), format="hf", architecture="llama",
              parameters=13_120_000, tensor_types=["F32"], size_bytes=52_600_000, native_context=2048,
              quant_mix="F32 75"),
    ModelInfo(id="qwen2.5-0.5b-instruct-q8_0", path="/data/models/qwen2.5-0.5b-instruct-q8_0.gguf", format="gguf",
              architecture="qwen2", parameters=494_000_000, tensor_types=["F32", "Q8_0"], size_bytes=531_000_000,
              native_context=32768, quant_mix="Q8_0: Q8_0 169, F32 121"),
    ModelInfo(id="Llama-3.2-1B-Instruct", path="/data/models/Llama-3.2-1B-Instruct", format="hf",
              architecture="llama", parameters=1_235_814_400, tensor_types=["BF16"], size_bytes=2_471_645_608,
              native_context=131072, quant_mix="BF16 146"),
]

ARGV = ["--model", "/opt/lockstep/assets/models/lockstep-pycode-13m", "--alias", "lockstep-pycode-13m", "--host",
        "127.0.0.1", "--port", "41234", "--parallel", "4", "--api-key", "***", "--ctx-size", "4096",
        "--flash-attn", "auto", "--cache-type-k", "f16", "--cache-type-v", "f16", "--kv-unified",
        "--exact-concurrency", "on"]


def slot(i: int, busy: bool, parked: bool = False, prompt: int = 0, generated: int = 0) -> dict[str, Any]:
    return {"id": i, "n_ctx": 1024, "is_processing": busy, "is_preempted": parked, "n_preempt": 2 if i == 1 else 0,
            "n_restore": 2 if i == 1 else 0, "prompt_tokens": prompt, "generated": generated,
            "cached_tokens": prompt}


READY = {
    "model": "lockstep-pycode-13m", "model_path": str(BUNDLED / "lockstep-pycode-13m"), "state": "ready",
    "exact_concurrency": "on", "requested_exact_concurrency": "on", "exact_reason": None, "preempt_mode": "auto",
    "threads": "auto", "threads_in_use": 2,
    "warnings": [], "argv": ARGV, "attempts": [{"attempt": 1}], "port": 41234, "pid": 4242, "error": None,
    "slots": [slot(0, True, prompt=48, generated=17), slot(1, True, prompt=61, generated=9),
              slot(2, False, parked=True, prompt=55, generated=31), slot(3, False)],
    "pages_used": 5.0, "pages_free": 11.0, "parks": 3.0, "restores": 3.0, "tokens_per_second": 812.4,
}


class FakeCatalog:
    """Stands in for a catalog of MODELS, which are not on this machine (and too big for its tests)."""

    def __init__(self, models: list[ModelInfo]) -> None:
        self.models = models

    def roots(self) -> list[Path]:
        return [Path("/data/models"), BUNDLED]

    def scan(self) -> list[ModelInfo]:
        return list(self.models)

    def find(self, ref: str) -> ModelInfo | None:
        return next((m for m in self.models if m.id == ref), None)


class FakeStore:
    """A settings store at a fixed path (the real one's path is a temporary folder, shown on screen)."""

    path = Path("/home/ada/.config/lockstep/settings.json")
    problems: list = []
    version = "fixed"

    def __init__(self) -> None:
        self.settings = Settings(model_folders=["/data/models"], exact_concurrency="on")

    def refresh(self) -> Settings:
        return self.settings

    def update(self, patch: dict[str, Any], expected_version: str | None = None) -> Settings:
        self.settings = Settings.model_validate({**self.settings.model_dump(), **patch})
        return self.settings


class FakeManager:
    """The parts of LoadManager the TUI uses, answering with a fixed status: a real engine's port, pid,
    tokens/s, parks and log lines differ on every run."""

    def __init__(self, status: dict[str, Any] | None = None, models: list[ModelInfo] = MODELS) -> None:
        self.store = FakeStore()
        self.env: dict[str, str] = {}
        self.catalog = FakeCatalog(models)
        self.log_dir = Path("/home/ada/.local/state/lockstep/log")
        self._status = status or {"model": None, "state": "stopped", "error": None}
        self.state = self._status["state"]
        self.loaded = None

    def effective_settings(self) -> Settings:
        return self.store.settings

    def exact_view(self) -> dict[str, Any]:
        return {"exact_concurrency": "on", "effective": "on", "default": "off", "env_override": None,
                "active": "on", "reload_required": False}

    async def status(self) -> dict[str, Any]:
        return dict(self._status)

    def logs(self, tail_bytes: int = 65536) -> dict[str, Any]:
        text = ("# lockstep attempt 1 of at most 4\n"
                "# argv: python -m engine --model /opt/lockstep/assets/models/lockstep-pycode-13m --port 41234\n"
                "# env: LOCKSTEP_EXACT=1 LOCKSTEP_PREEMPT_MODE=auto\n"
                "INFO engine.server: exact concurrency: on (page size 256, backend cpu)\n"
                "INFO engine.server: model loaded: lockstep-pycode-13m; server is ready (slots=4, pages=16)\n"
                "engine preemption armed: mode=auto exact=on\n")
        return {"attempts": [{"attempt": 1, "outcome": "ready", "change": None, "text": text}],
                "studio_log": "studio.log", "studio": "INFO loading lockstep-pycode-13m\n"}

    async def shutdown(self) -> None:
        pass

    async def unload(self) -> dict[str, Any]:
        return {"status": "not_loaded"}


@pytest.fixture(autouse=True)
def fixed_bundled_dir(monkeypatch):
    # The bundled folder's real location depends on the checkout; the screens show it.
    monkeypatch.setattr("studio.tui.app.bundled_models_dir", lambda: BUNDLED)
    monkeypatch.setattr("studio.tui.screens.models.bundled_models_dir", lambda: BUNDLED)


def make_app(status: dict[str, Any] | None = None, models: list[ModelInfo] = MODELS) -> LockstepApp:
    return LockstepApp(FakeManager(status, models), api=False, poll_interval=3600)


async def settle(pilot) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def on_screen(key: str):
    """A run_before that settles, switches to the screen on `key`, and settles again."""

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press(key)
        await settle(pilot)

    return run_before


def test_models_screen(snap_compare):
    """The catalog with the bundled default first and selected, its details on the right."""
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=settle)


def real_app(tmp_path) -> LockstepApp:
    """The real LoadManager, settings store and catalog (over folders that hold no model): the screens that
    show no engine need no stand-in."""
    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([Path("/data/models"), BUNDLED],
                          include_bundled=False), env={}, logs=tmp_path / "logs")
    return LockstepApp(manager, api=False, poll_interval=3600)


def test_models_screen_empty_catalog(snap_compare, tmp_path):
    """No models anywhere: the hint says where it looked and what to do."""
    assert snap_compare(real_app(tmp_path), terminal_size=SIZE, run_before=settle)


def test_load_screen(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=on_screen("f2"))


def test_load_screen_refused(snap_compare):
    """exact on with a quantized KV cache: the inline warning, then the refusal where the user acted."""

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f2")
        await settle(pilot)
        screen = pilot.app.screen
        screen.query_one("#field-exact").value = "on"
        screen.query_one("#field-extra_args").value = "-ctk q8_0"
        await pilot.pause()
        pilot.app.load_outcome = LoadOutcome(
            "load", "lockstep-pycode-13m", False,
            "exact_concurrency is on, and the engine refused it: KV cache type q8_0 is not supported; use -ctk f16 "
            "(or bf16). Meet that requirement, or set exact_concurrency to auto or off", "exact_refusal")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_status_screen_exact_on(snap_compare):
    assert snap_compare(make_app(READY), terminal_size=SIZE, run_before=on_screen("f3"))


def test_status_screen_unavailable(snap_compare):
    status = {**READY, "exact_concurrency": "unavailable", "requested_exact_concurrency": "auto",
              "exact_reason": "exact concurrency: KV cache type q8_0 is not supported; use -ctk f16 (or bf16)",
              "warnings": [{"code": "exact_kv_quantized", "flag": "--cache-type-k",
                            "message": "--cache-type-k q8_0 is a quantized KV cache; exact mode needs f32, f16, bf16"}]}

    assert snap_compare(make_app(status), terminal_size=SIZE, run_before=on_screen("f3"))


def test_status_screen_no_model(snap_compare, tmp_path):
    assert snap_compare(real_app(tmp_path), terminal_size=SIZE, run_before=on_screen("f3"))


async def chat_before(pilot):
    from studio.tui.widgets.chat_message import ChatMessage

    await settle(pilot)
    await pilot.press("f4")
    pilot.app.screen.query_one("#prompt").cursor_blink = False  # a blinking cursor made the SVG vary
    await settle(pilot)
    transcript = pilot.app.screen.query_one("#transcript")
    await transcript.mount(ChatMessage("user", "def fibonacci(n):"))
    reply = ChatMessage("assistant", title="lockstep-pycode-13m")
    await transcript.mount(reply)
    reply.append("    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n")
    reply.finish("23 tokens · 61.3 tokens/s · first token 0.04 s · seed 1234 · stop")
    pilot.app.screen.query_one("#system").value = "You are a terse Python tutor."
    await pilot.pause()


def test_chat_screen(snap_compare):
    assert snap_compare(make_app(READY), terminal_size=SIZE, run_before=chat_before)


def test_exactness_screen_report(snap_compare):
    cells = [("solo_twice", "P0 alone, run again"), ("beside_3", "P0 beside 3 neighbours"),
             ("beside_7", "P0 beside 7 neighbours"), ("prompt_cache_hit", "P0 after its prefix was cached"),
             ("forced_parks_7", "parked and restored every 7 tokens, beside 3")]
    report = Report("lockstep-pycode-13m", "on", 24, 8, [
        Cell(name=n, description=d, identical=True, first_diff=None, first_token_diff=None, n_tokens=24)
        for n, d in cells], [], 41.0)
    report.cells.append(Cell(name="ctx_1024", description="--ctx-size 1024", identical=False, first_diff=17,
                             first_token_diff=19, n_tokens=24))

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f5")
        await settle(pilot)
        pilot.app.screen.show_report(report)
        await pilot.pause()

    assert snap_compare(make_app(READY), terminal_size=SIZE, run_before=run_before)


def test_logs_screen(snap_compare):
    assert snap_compare(make_app(READY), terminal_size=SIZE, run_before=on_screen("f6"))


def test_settings_screen(snap_compare):
    assert snap_compare(make_app(READY), terminal_size=SIZE, run_before=on_screen("f7"))


@pytest.mark.parametrize("key", ["f1", "f2", "f3", "f7"])
def test_screens_at_80x24(snap_compare, key):
    assert snap_compare(make_app(READY), terminal_size=SMALL, run_before=on_screen(key))


def test_chat_screen_at_80x24(snap_compare):
    assert snap_compare(make_app(READY), terminal_size=SMALL, run_before=chat_before)
