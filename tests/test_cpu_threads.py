"""-t/--threads: the engine child sets its BLAS and compiled-kernel pools to the flag's count, and says so."""

import json
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
    # read back from threadpoolctl and numba inside the child, not echoed from the flag
    assert props["cpu_threads"] == {"blas": [threads], "compiled_pool": threads}
    body = json.dumps({"prompt": "hello", "n_predict": 4, "temperature": 0}).encode()
    req = urllib.request.Request(engine.base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["tokens_predicted"] == 4


def test_zero_threads_is_a_bad_command_line(tiny_llama):
    from tests.engine_helpers import run_engine

    done = run_engine(["-m", str(tiny_llama), "-t", "0"])
    assert done.returncode == 2
    assert "-t/--threads" in done.stderr
