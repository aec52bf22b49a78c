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
    installs = [line for line in plan.splitlines() if "pip install" in line or "install.sh" in line]
    assert installs and all("scripts/install.sh" in line for line in installs), installs
    assert all("[test" not in line and " -q" not in line for line in installs), installs
    assert "installing Lockstep and its runtime dependencies" in plan
    assert "starting the studio" in plan


def test_make_test_adds_the_test_extras_on_a_stamp_of_its_own(tmp_path):
    plan = dry_run("test", tmp_path)
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert any("[test]" in line for line in installs), installs
    assert ".runtime-installed" in plan and ".test-installed" in plan
    assert "pytest" in plan


def test_an_old_python_is_refused_by_name_before_anything_is_made(tmp_path):
    # A stand-in interpreter that answers as Python 3.10 does: this machine has no old Python to run.
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\n[ "$1" = "-V" ] && echo "Python 3.10.12" && exit 0\nexit 1\n')
    old.chmod(0o755)
    done = subprocess.run(["make", f"VENV={tmp_path / 'venv'}", f"PYTHON={old}", "run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "needs Python 3.11 or newer" in done.stdout and "Python 3.10.12" in done.stdout, done.stdout
    assert not (tmp_path / "venv").exists()


def test_a_missing_python_is_named_as_missing(tmp_path):
    done = subprocess.run(["make", f"VENV={tmp_path / 'venv'}", f"PYTHON={tmp_path / 'python3.12'}", "run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"{tmp_path / 'python3.12'} is not found." in done.stdout and "sh:" not in done.stdout, done.stdout
    assert not (tmp_path / "venv").exists()


def test_a_venv_that_could_not_be_made_is_not_left_to_pass_for_one(tmp_path):
    # A stand-in interpreter whose venv module fails half-way, as one without ensurepip does (Debian's
    # python3 without python3-venv), which this machine's Python cannot be made to do.
    broken = tmp_path / "python3"
    broken.write_text('#!/bin/sh\n[ "$1" = "-c" ] && exit 0\n'
                      '[ "$2" = "venv" ] && mkdir -p "$3/bin" && touch "$3/bin/python" && exit 1\nexit 1\n')
    broken.chmod(0o755)
    for _ in range(2):  # the second run tries again rather than trusting what the first left
        done = subprocess.run(["make", f"VENV={tmp_path / 'venv'}", f"PYTHON={broken}", "run"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert "could not create" in done.stdout and "python3-venv" in done.stdout, done.stdout
        assert not (tmp_path / "venv").exists()


def stand_ins(tmp_path, uv_works: bool = True) -> Path:
    """A venv's python and uv that record how they were called (nothing is installed)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "python $*" >> {calls}\n')
    (bin_dir / "uv").write_text(f'#!/bin/sh\necho "uv $*" >> {calls}\n' + ("" if uv_works else "exit 1\n"))
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir / "python"


def install(tmp_path, python: Path, **env: str) -> list[str]:
    done = subprocess.run([str(ROOT / "scripts" / "install.sh"), str(python), "-e", "."], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stderr
    return (tmp_path / "calls").read_text().splitlines()


def test_the_runtime_goes_in_through_uv_when_the_venv_has_it(tmp_path):
    python = stand_ins(tmp_path)
    assert install(tmp_path, python) == [f"uv pip install --python {python} -e ."]


def test_pip_without_byte_compiling_when_uv_fails_or_is_not_wanted(tmp_path):
    python = stand_ins(tmp_path, uv_works=False)
    calls = install(tmp_path, python)
    assert calls[0].startswith("uv pip install") and calls[1].startswith("python -m pip install"), calls
    assert "--no-compile" in calls[1] and calls[1].endswith("-e ."), calls
    (tmp_path / "calls").unlink()
    assert [c.split()[:4] for c in install(tmp_path, python, LOCKSTEP_NO_UV="1")] == [
        ["python", "-m", "pip", "install"]]
