"""Precedence of exact_concurrency and preempt_mode: env -> request -> store -> inherited -> default."""

import itertools

import pytest

from settings import EnvOverrideError, exact_default, resolve_exact, resolve_preempt

MODES = [None, "auto", "off", "on"]
INHERITED = [None, "1", "0", ""]


def expected_exact(env, request, stored, inherited):
    # DESIGN.md "Studio": highest first.
    for value, source in ((env, "env"), (request, "request"), (stored, "store")):
        if value is not None:
            return value, source
    if inherited == "1":
        return "on", "inherited"
    return "off", "default"


def make_env(env_value, inherited):
    env = {"UNRELATED": "x"}
    if env_value is not None:
        env["LOCKSTEP_EXACT_CONCURRENCY"] = env_value
    if inherited is not None:
        env["LOCKSTEP_EXACT"] = inherited
    return env


@pytest.mark.parametrize(("env_value", "request_value", "stored", "inherited"),
                         list(itertools.product(MODES, MODES, MODES, INHERITED)))
def test_exact_every_combination(env_value, request_value, stored, inherited):
    got = resolve_exact(request_value, stored, make_env(env_value, inherited))
    assert (got.value, got.source) == expected_exact(env_value, request_value, stored, inherited)


def test_env_outranks_a_request_that_says_otherwise():
    got = resolve_exact("on", "on", {"LOCKSTEP_EXACT_CONCURRENCY": "off", "LOCKSTEP_EXACT": "1"})
    assert (got.value, got.source) == ("off", "env")


def test_inherited_engine_variable_is_the_weakest_setting():
    assert resolve_exact(None, "off", {"LOCKSTEP_EXACT": "1"}).value == "off"
    assert resolve_exact(None, None, {"LOCKSTEP_EXACT": "1"}).value == "on"


@pytest.mark.parametrize("raw", ["ON", " auto ", "Off"])
def test_env_value_is_case_and_space_insensitive(raw):
    assert resolve_exact("off" if raw.strip().lower() != "off" else "on", None,
                         {"LOCKSTEP_EXACT_CONCURRENCY": raw}).value == raw.strip().lower()


def test_empty_env_value_counts_as_unset():
    got = resolve_exact("auto", None, {"LOCKSTEP_EXACT_CONCURRENCY": ""})
    assert (got.value, got.source) == ("auto", "request")


@pytest.mark.parametrize("raw", ["yes", "1", "exact", "o n"])
def test_invalid_env_value_is_an_error_naming_the_variable(raw):
    with pytest.raises(EnvOverrideError, match="LOCKSTEP_EXACT_CONCURRENCY"):
        resolve_exact(None, None, {"LOCKSTEP_EXACT_CONCURRENCY": raw})


@pytest.mark.parametrize(("inherited", "default"), [(None, "off"), ("1", "on"), ("0", "off"), ("true", "on"),
                                                    ("off", "off")])
def test_exact_default_reads_inherited_as_the_engine_does(inherited, default):
    env = {} if inherited is None else {"LOCKSTEP_EXACT": inherited}
    assert exact_default(env) == default


def test_an_inherited_switch_neither_side_understands_is_an_error():
    with pytest.raises(EnvOverrideError, match="LOCKSTEP_EXACT"):
        exact_default({"LOCKSTEP_EXACT": "maybe"})


PREEMPT = [None, "auto", "park", "recompute"]


@pytest.mark.parametrize(("env_value", "request_value", "stored"), list(itertools.product(PREEMPT, PREEMPT, PREEMPT)))
def test_preempt_every_combination(env_value, request_value, stored):
    env = {} if env_value is None else {"LOCKSTEP_PREEMPT_MODE": env_value}
    env["LOCKSTEP_EXACT"] = "1"  # has no say over the preemption mode
    got = resolve_preempt(request_value, stored, env)
    want = next(((v, s) for v, s in ((env_value, "env"), (request_value, "request"), (stored, "store"))
                 if v is not None), ("auto", "default"))
    assert (got.value, got.source) == want


def test_invalid_preempt_env_is_an_error():
    with pytest.raises(EnvOverrideError, match="LOCKSTEP_PREEMPT_MODE"):
        resolve_preempt(None, None, {"LOCKSTEP_PREEMPT_MODE": "sometimes"})
