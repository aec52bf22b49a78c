"""`make run` installs the runtime only and says so; `make test` adds the test extras (dry runs, nothing installed)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, tmp_path) -> str:
    # A venv path that does not exist: make plans the whole first-run install.
    done = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", target], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_the_runtime_only_and_says_what_it_does(tmp_path):
    plan = dry_run("run", tmp_path)
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert installs, plan
    assert all("[test" not in line and " -q" not in line for line in installs), installs
    assert "installing Lockstep and its runtime dependencies" in plan
    assert "starting the studio" in plan


def test_make_test_adds_the_test_extras_on_a_stamp_of_its_own(tmp_path):
    plan = dry_run("test", tmp_path)
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert any("[test]" in line for line in installs), installs
    assert ".runtime-installed" in plan and ".test-installed" in plan
    assert "pytest" in plan
