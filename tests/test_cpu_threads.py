"""-t/--threads: the engine child sets its compiled-kernel pool to the flag's count and BLAS to one thread a call,
and says so."""

import json
import os
import subprocess
import sys
import urllib.request

import pytest


def _props(engine) -> dict:
    with urllib.request.urlopen(engine.base + "/props", timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.parametrize(("args", "threads"), [((), 1), (("-t", "2"), 2), (("--threads", "3"), 3)],
                         ids=["default", "short", "long"])
def test_child_honours_the_thread_count(engine_factory, tiny_llama, args, threads):
    engine = engine_factory(tiny_llama, *args)
    props = _props(engine)
    assert props["n_threads"] == threads
    # read back from threadpoolctl and numba inside the child, not echoed from the flag; BLAS runs one
    # thread a call whatever the flag (the flag's threads split its products: lockstep_kernels/cpu/blas_split.py)
    assert props["cpu_threads"] == {"blas": [1], "compiled_pool": threads}
    body = json.dumps({"prompt": "hello", "n_predict": 4, "temperature": 0}).encode()
    req = urllib.request.Request(engine.base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["tokens_predicted"] == 4


def test_zero_threads_is_a_bad_command_line(tiny_llama):
    from tests.engine_helpers import run_engine

    done = run_engine(["-m", str(tiny_llama), "-t", "0"])
    assert done.returncode == 2
    assert "-t/--threads" in done.stderr


@pytest.mark.parametrize(("given", "seen"), [(None, "4"), ("12", "12")], ids=["default", "the user's"])
def test_the_engine_lets_idle_blas_threads_sleep_at_once(given, seen):
    """OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when NumPy loads it; left unset its threads spin about 0.1 s
    after each call, on the cores the compute thread and the kernel workers need. The engine package
    sets it (a user's value wins) before anything of the engine imports NumPy."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    code = ("import sys, os, engine.cli; assert 'numpy' in sys.modules; "
            "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == seen
