"""The engine↔studio contract, checked from both sides: the studio never imports the engine at run
time, so what it re-states (verdict lines, exit codes, flags, environment switches, the page size)
is compared here with the engine's own definitions."""

import itertools
import re
from pathlib import Path

import pytest

import engine.exits as exits
from contract import PAGE_SIZE, progress
from contract.env import REGISTRY, parse_switch
from contract.progress import LoadStep
from engine.cli import UNSUPPORTED_KV, build_parser
from engine.exact import exact_requested, refuse
from settings import CACHE_TYPES
from settings.env import EnvOverrideError
from settings.precedence import inherited_exact
from studio.failures import EXIT_CODES, classify
from studio.flags import BY_NAME, FLAGS, parse_extra_args
from tests.engine_helpers import ROOT, run_engine

PRODUCT = [p for d in ("contract", "engine", "lockstep_kernels", "settings", "studio") for p in (ROOT / d).rglob("*.py")]
# Engine options the studio does not pass through, and why.
ENGINE_ONLY = {
    "-h": "help", "--help": "help",
    "--api-key-file": "the studio hands its child a key in the environment",
    "--body-limit": "a server limit the studio's proxy has its own of",
    "--cors-origins": "browsers talk to the studio's API, not the child",
    "--max-connections": "the child's only client is the studio",
    "--timeout": "the studio's proxy times requests", "-to": "the studio's proxy times requests",
}


def exit_codes() -> dict[str, int]:
    return {name: value for name, value in vars(exits).items() if name.isupper() and isinstance(value, int)}


def test_every_engine_exit_code_has_a_studio_kind_and_back():
    assert sorted(exit_codes().values()) == sorted(EXIT_CODES)


def fatal_sites() -> list[tuple[str, str, str]]:
    """Every `Fatal(CODE, "prefix...` in the engine, with the literal start of its line."""
    found = []
    for path in (ROOT / "engine").rglob("*.py"):
        for code, prefix in re.findall(r'Fatal\(([A-Z_]+), f?"([^"{]*)', path.read_text()):
            if prefix or path.name != "exact.py":  # exact.py builds its line from PREFIX: see refuse() below
                found.append((path.name, code, prefix))
    return found


@pytest.mark.parametrize("site", fatal_sites(), ids=lambda s: f"{s[0]}:{s[1]}")
def test_every_verdict_line_in_the_engine_is_classified_as_its_exit_code(site):
    _, code_name, prefix = site
    code = exit_codes()[code_name]
    line = prefix + "some detail"
    failure = classify(f"2026-01-01 12:00:00.000 INFO engine: starting\n{line}\n", code)
    assert failure.kind == EXIT_CODES[code] and failure.line == line and failure.detail


@pytest.mark.parametrize("fatal", [
    exits.bad_flag("--ctx-size -1: expects an integer >= 0"),
    exits.out_of_memory(3 << 30, 1 << 30),
    refuse("KV cache type q8_0 is not supported", "-ctk f16 (or bf16)"),
], ids=["bad_flag", "out_of_memory", "exact_refusal"])
def test_engine_verdict_builders_classify(fatal):
    failure = classify(fatal.line + "\n", fatal.code)
    assert failure.kind == EXIT_CODES[fatal.code] and failure.line == fatal.line
    if failure.kind == "exact_refusal":
        assert failure.fix == "-ctk f16 (or bf16)"


@pytest.mark.parametrize(("args", "kind"), [
    (["--ctx-size", "-5"], "bad_flags"),
    (["-m", "/nonexistent/model.gguf"], "bad_model"),
    (["--exact-concurrency", "on", "-ctk", "q8_0"], "exact_refusal"),
])
def test_real_engine_failures_classify(tiny_llama, args, kind):
    argv = ["-m", str(tiny_llama), "--device", "cpu", *args] if args[0] != "-m" else [*args, "--device", "cpu"]
    r = run_engine(argv)
    assert r.returncode != 0
    assert classify(r.stderr, r.returncode).kind == kind, r.stderr[-500:]


def engine_options() -> dict:
    return {o: a for a in build_parser()._actions for o in a.option_strings}


def test_studio_flag_table_matches_the_engine_parser():
    eng = engine_options()
    assert set(BY_NAME) <= set(eng), set(BY_NAME) - set(eng)
    assert set(eng) - set(BY_NAME) == set(ENGINE_ONLY)
    for flag in FLAGS:
        for name in flag.names:
            assert (eng[name].nargs != 0) == flag.takes_value, name
        # the short and long spellings are one engine option
        assert len({id(eng[n]) for n in flag.names}) == 1, flag.names


@pytest.mark.parametrize("name", [f.canonical for f in FLAGS if f.check and not f.owned_by])
def test_studio_accepts_every_engine_choice_and_refuses_others(name):
    action = engine_options()[name]
    for choice in action.choices or ():
        assert parse_extra_args([name, choice]) == {name: choice}
    if action.choices:
        with pytest.raises(ValueError):
            parse_extra_args([name, "bogus-choice"])


def test_cache_types_the_studio_offers_are_ones_the_engine_knows():
    from lockstep_kernels.base import KV_TYPES
    assert set(CACHE_TYPES) <= set(KV_TYPES) | set(UNSUPPORTED_KV)


@pytest.mark.parametrize("word", ["1", "on", "TRUE", "yes", "0", "off", "false", "No", "", "  ", "maybe", "2"])
def test_lockstep_exact_reads_the_same_in_engine_and_studio(word):
    env = {"LOCKSTEP_EXACT": word}
    try:
        expected = parse_switch(word)
    except ValueError:
        with pytest.raises(exits.Fatal):
            exact_requested(None, env)
        with pytest.raises(EnvOverrideError):
            inherited_exact(env)
        return
    assert exact_requested(None, env) is expected
    assert inherited_exact(env) is expected


def test_one_page_size():
    from lockstep_kernels.base import PAGE_SIZE as kernels_page
    assert kernels_page is PAGE_SIZE
    for cuh in (ROOT / "lockstep_kernels" / "cuda").glob("*.cuh"):
        for value in re.findall(r"#define PAGE (\d+)", cuh.read_text()):
            assert int(value) == PAGE_SIZE, cuh.name
    assert not [p for p in PRODUCT if re.search(r"^PAGE_SIZE\s*=", p.read_text(), re.M) and p.parts[-2] != "contract"]


def test_every_environment_variable_read_is_registered():
    names = {v.name for v in REGISTRY}
    used = {m for p in PRODUCT for m in re.findall(r'"(LOCKSTEP_[A-Z_]+)"', p.read_text())}
    assert used <= names, used - names


def test_one_constant_time_compare():
    users = [p for p in PRODUCT if re.search(r"compare_digest", p.read_text())]
    assert [p.relative_to(ROOT).as_posix() for p in users] == ["contract/auth.py"]


def test_layer_contracts_hold():
    import subprocess
    import sys
    r = subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]


@pytest.mark.parametrize("step", [LoadStep("read"), LoadStep("kernels"), LoadStep("weights", 12, 50, 1 << 20, 4 << 20),
                                  LoadStep("warmup")], ids=lambda s: s.phase)
def test_load_progress_lines_read_back_as_written(step):
    assert progress.parse(f"2026-01-01 12:00:00.000 INFO engine.load: {step.line()}") == step
    assert progress.parse(step.line().replace(step.phase, "bogus")) is None


def test_every_load_phase_the_engine_logs_is_one_the_studio_reads():
    used = {m for p in (ROOT / "engine").rglob("*.py") for m in re.findall(r'load_progress\.phase\("(\w+)"\)',
                                                                             p.read_text())}
    assert used and used <= set(progress.PHASES), used - set(progress.PHASES)


def test_a_real_engine_load_logs_progress_the_studio_reads(tiny_llama, engine_factory):
    from engine.loader import load_model
    from studio.load_progress import read_progress

    eng = engine_factory(tiny_llama, "--device", "cpu")
    steps = [s for s in map(progress.parse, eng.output().splitlines()) if s is not None]
    weights = load_model(tiny_llama).weights
    n, total = len(weights), sum(w.nbytes for w in weights.values())
    assert [s.phase for s in steps if s.phase != "weights"] == ["read", "kernels", "warmup"]
    counted = [s for s in steps if s.phase == "weights"]
    assert counted[0] == LoadStep("weights", 0, n, 0, total) and counted[-1] == LoadStep("weights", n, n, total, total)
    assert all(a.bytes <= b.bytes and a.tensors <= b.tensors for a, b in itertools.pairwise(counted))
    seen = read_progress(eng.log.name)
    assert seen["phase"] == "warmup" and seen["memory"].startswith("memory: needs"), seen
