"""-t/--threads: the default is one thread per physical core the engine may run on (llama-server's),
at most THREADS_CAP; LLAMA_ARG_THREADS stands in for an absent -t; -t 1 still gives one; /props and
the load log say the count in use."""

from __future__ import annotations

import pytest

from engine.threads import THREADS_CAP, physical_cores, resolve_threads
from tests.engine_helpers import last_line, run_engine

UNSET = {"LLAMA_ARG_THREADS": ""}  # the suite's conftest sets it to 1; empty reads as unset


def _topology(tmp_path, cores: dict[int, tuple[int, int]]) -> str:
    """A fake /sys/devices/system/cpu: {cpu: (package, core)}."""
    for cpu, (package, core) in cores.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return str(tmp_path / "cpu{}" / "topology" / "{}")


def test_smt_siblings_count_as_one_core(tmp_path):
    # cpus 0/2 and 1/3 are hyper-threads of cores 0 and 1; package 1 has its own core 0
    topology = _topology(tmp_path, {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1), 4: (1, 0)})
    assert physical_cores([0, 1, 2, 3, 4], topology) == 3
    assert physical_cores([0, 2], topology) == 1  # an affinity of one core's two siblings
    assert physical_cores([0, 9], topology) == 2  # cpu 9 has no topology: a core of its own


def test_flag_then_variable_then_physical_cores():
    cores = min(physical_cores(), THREADS_CAP)
    assert resolve_threads(3, {"LLAMA_ARG_THREADS": "5"}) == (3, "-t")
    assert resolve_threads(None, {"LLAMA_ARG_THREADS": "5"}) == (5, "LLAMA_ARG_THREADS")
    assert resolve_threads(-1, {"LLAMA_ARG_THREADS": "5"}) == (5, "LLAMA_ARG_THREADS")
    assert resolve_threads(None, {})[0] == cores
    assert resolve_threads(-1, {"LLAMA_ARG_THREADS": "-1"})[0] == cores
    assert resolve_threads(None, UNSET)[0] == cores
    for bad in ("0", "two", "-3"):
        with pytest.raises(ValueError, match="LLAMA_ARG_THREADS"):
            resolve_threads(None, {"LLAMA_ARG_THREADS": bad})


def test_help_says_the_default_is_the_physical_cores():
    r = run_engine(["--help"])
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "one per physical core this process may use" in text and f"at most {THREADS_CAP}" in text


@pytest.mark.parametrize("args, env, line", [
    (["-t", "0"], None, "error: -t/--threads 0: expects at least 1, or -1 for the default"),
    ([], {"LLAMA_ARG_THREADS": "many"}, "error: LLAMA_ARG_THREADS='many': expects an integer >= 1"),
])
def test_bad_thread_counts_are_named(tiny_llama, args, env, line):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cpu", *args], env=env)
    assert r.returncode == 2, r.stderr
    assert last_line(r.stderr).startswith(line)


@pytest.mark.parametrize("args, expected, source", [
    ([], None, "physical cores"),  # None: the physical cores of this machine, capped
    (["-t", "1"], 1, "-t"),
    (["-t", "-1"], None, "physical cores"),
])
def test_props_and_the_log_say_the_threads_in_use(engine_factory, tiny_llama, args, expected, source):
    expected = expected or min(physical_cores(), THREADS_CAP)
    eng = engine_factory(tiny_llama, *args, env=UNSET)
    props = eng.get_json("/props")
    assert props["n_threads"] == expected
    assert props["cpu_threads"]["compiled_pool"] == expected
    assert f"CPU threads: {expected} ({source}" in eng.output()


def test_the_suites_variable_gives_test_engines_one_thread(engine_factory, tiny_llama):
    eng = engine_factory(tiny_llama)
    assert eng.get_json("/props")["n_threads"] == 1
    assert "CPU threads: 1 (LLAMA_ARG_THREADS)" in eng.output()
