"""`lockstep`: help texts, the TUI's absence explained, and `lockstep serve` running headless."""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from studio.cli import main
from studio.engine_child import free_port


def test_help_explains_the_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "serve" in out and "terminal UI" in out and "LOCKSTEP_EXACT_CONCURRENCY" in out


def test_serve_help_explains_each_option(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for option in ("--host", "--port", "--api-key"):
        assert option in out
    assert "Authorization: Bearer" in out


def test_without_the_tui_module_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "studio.tui.app", None)  # importing it now raises ImportError
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "terminal UI is not available" in err and "lockstep serve" in err


def test_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def _get(url, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_serve_runs_the_api_headless_and_stops_on_sigint(tmp_path):
    port = free_port()
    env = {**os.environ, "LOCKSTEP_CONFIG_DIR": str(tmp_path / "cfg"), "LOCKSTEP_LOG_DIR": str(tmp_path / "logs")}
    proc = subprocess.Popen([sys.executable, "-m", "studio", "serve", "--port", str(port), "--api-key", "k"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        status = None
        while status is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                status = _get(f"http://127.0.0.1:{port}/api/status", "k")
            except OSError:
                time.sleep(0.05)  # not listening yet; bounded by the deadline
        assert status == 200
        assert _get(f"http://127.0.0.1:{port}/api/status") == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert f"http://127.0.0.1:{port}" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_studio_does_not_import_the_engine():
    # It talks to the engine by argv, environment and HTTP only (DESIGN.md "Layout").
    code = ("import sys, studio.cli, studio.api, studio.manager, studio.catalog; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'engine'); print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
