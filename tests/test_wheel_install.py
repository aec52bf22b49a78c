"""Installable as a package: a wheel built from this tree, installed into a fresh venv, finds its
package data (stylesheets, the bundled model) and runs without the source tree.

Offline and quick: the fresh venv gets the wheel with --no-deps, and sees the test interpreter's
installed dependencies through a .pth line (no editable finder of the checkout is active there:
.pth files of that directory are not processed), run from a folder outside the checkout.
"""

import json
import os
import shutil
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.engine_helpers import ROOT

pytestmark = pytest.mark.slow
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".ruff_cache",
                              ".import_linter_cache", ".pytest_cache", "tests", "bench", "docs")


def clean_env(home: Path) -> dict:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env |= {"HOME": str(home), "LOCKSTEP_CONFIG_DIR": str(home / "config"), "LOCKSTEP_LOG_DIR": str(home / "logs")}
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(work / "dist"), str(src)], capture_output=True, text=True, timeout=600,
                           env=clean_env(work))
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("lockstep-*.whl")
    env_dir = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "shared_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # without PYTHONPATH, and forced: the checkout (and the shared venv's editable install) hold a
    # lockstep of the same version, which pip would otherwise take as already installed
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                                "--no-index", "--force-reinstall", str(wheel)], capture_output=True, text=True,
                               timeout=600, env=clean_env(work))
    assert installed.returncode == 0, installed.stderr[-3000:]
    home = work / "home"
    home.mkdir()
    return env_dir, home


def run(venv, *argv, timeout=300):
    env_dir, home = venv
    return subprocess.run([str(env_dir / "bin" / argv[0]), *argv[1:]], cwd=home, env=clean_env(home),
                          capture_output=True, text=True, timeout=timeout)


def test_package_data_comes_from_the_install(venv):
    r = run(venv, "python", "-c", "import json, studio.catalog as c, studio.tui.stylesheets as s, engine; "
            "print(json.dumps([str(c.bundled_models_dir()), str(s.STYLE_DIR), engine.__file__]))")
    assert r.returncode == 0, r.stderr
    models, styles, engine_file = (Path(p) for p in json.loads(r.stdout))
    for p in (models, styles, engine_file):
        assert venv[0] in p.parents, p  # the wheel's copy, not the checkout's
    assert (styles / "app.tcss").is_file() and (models / "lockstep-pycode-13m" / "model.safetensors").is_file()


def test_engine_help_and_generate_on_the_bundled_model(venv):
    r = run(venv, "lockstep-engine", "--help")
    assert r.returncode == 0 and "--exact-concurrency" in r.stdout
    model = run(venv, "python", "-c", "import studio.catalog as c; print(c.bundled_models_dir() / 'lockstep-pycode-13m')")
    r = run(venv, "lockstep-engine", "generate", "-m", model.stdout.strip(), "-p", "def fibonacci(n):", "-n", "8",
            "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() and "completion_tokens=8" in r.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def test_serve_and_load_the_bundled_model(venv):
    env_dir, home = venv
    port = free_port()
    proc = subprocess.Popen([str(env_dir / "bin" / "lockstep"), "serve", "--port", str(port)], cwd=home,
                            env=clean_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                models = request(base + "/api/models", timeout=5)["models"]
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "lockstep serve did not answer"
                time.sleep(0.2)
        (bundled,) = [m for m in models if m["id"].startswith("lockstep-pycode")]
        loaded = request(base + "/api/load", {"model": bundled["id"], "ctx_size": 1024,
                                              "extra_args": ["--device", "cpu"]}, timeout=300)
        assert loaded["state"] == "ready", loaded
        out = request(base + "/v1/completions", {"model": bundled["id"], "prompt": "import os\n", "max_tokens": 4,
                                                 "temperature": 0})
        assert out["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        proc.wait(30)
