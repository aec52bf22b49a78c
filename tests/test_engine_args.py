"""The server's options are made once, frozen, from the flags and the environment."""

import dataclasses

import pytest

from engine.args import EngineArgs
from engine.cli import build_parser, engine_args


def parse(*argv, env=None):
    return engine_args(build_parser().parse_args(["-m", "/models/x", *argv]), env=env or {})


def test_every_flag_has_a_field_and_the_result_is_frozen():
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert dests <= {f.name for f in dataclasses.fields(EngineArgs)}
    args = parse()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.port = 1


def test_derived_values_come_from_the_environment_and_the_flags():
    args = parse("-b", "64", "-ub", "512", env={"LOCKSTEP_PREEMPT_MODE": "Recompute", "LLAMA_API_KEY": "k"})
    assert (args.ubatch_size, args.preempt_mode, args.api_key, args.chat_template) == (64, "recompute", "k", None)
    assert parse("--api-key", "flag", env={"LLAMA_API_KEY": "env"}).api_key == "flag"


def test_a_flag_without_a_field_is_an_error():
    ns = build_parser().parse_args(["-m", "/models/x"])
    ns.new_flag = 1
    with pytest.raises(TypeError, match="new_flag"):
        engine_args(ns, env={})
