"""Extra-args validation, exact-mode contradictions, engine argv composition and the child environment."""

import pytest

from settings import LoadDefaults
from studio.engine_child import child_env
from studio.flags import (
    BY_NAME,
    FLAGS,
    MAX_ARG_CHARS,
    MAX_EXTRA_ARGS,
    OWNED_FLAGS,
    ExtraArgsError,
    Owned,
    compose_argv,
    exact_contradictions,
    options_from_settings,
    parse_extra_args,
    redact_argv,
)

ACCEPTED = [
    ([], {}),
    (["--jinja"], {"--jinja": None}),
    (["--metrics", "--jinja"], {"--metrics": None, "--jinja": None}),
    (["-c", "2048"], {"--ctx-size": "2048"}),
    (["--ctx-size", "0"], {"--ctx-size": "0"}),
    (["--ctx-size=4096"], {"--ctx-size": "4096"}),
    (["-b", "512", "-ub", "128"], {"--batch-size": "512", "--ubatch-size": "128"}),
    (["-kvu"], {"--kv-unified": None}),
    (["-fa", "off"], {"--flash-attn": "off"}),
    (["--flash-attn", "auto"], {"--flash-attn": "auto"}),
    (["-ngl", "0"], {"--n-gpu-layers": "0"}),
    (["-ngl", "all"], {"--n-gpu-layers": "all"}),
    (["-ngl", "-1"], {"--n-gpu-layers": "-1"}),
    (["-nkvo"], {"--no-kv-offload": None}),
    (["-ctk", "q8_0", "-ctv", "bf16"], {"--cache-type-k": "q8_0", "--cache-type-v": "bf16"}),
    (["--cache-type-v=f32"], {"--cache-type-v": "f32"}),
    (["--context-shift"], {"--context-shift": None}),
    (["--no-context-shift"], {"--no-context-shift": None}),
    (["--cache-reuse", "256"], {"--cache-reuse": "256"}),
    (["--spec-type", "ngram", "--spec-draft-n-max", "8"], {"--spec-type": "ngram", "--spec-draft-n-max": "8"}),
    (["-s", "-1"], {"--seed": "-1"}),
    (["--seed", "42"], {"--seed": "42"}),
    (["--chat-template-file", "/tmp/t.jinja"], {"--chat-template-file": "/tmp/t.jinja"}),
    (["--chat-template-file", "/tmp/some dir/t.jinja"], {"--chat-template-file": "/tmp/some dir/t.jinja"}),
    (["--device", "cpu"], {"--device": "cpu"}),
    (["--preempt-ram", "1024"], {"--preempt-ram": "1024"}),
    (["--chat-template-file", "/tmp/ünïcode.jinja"], {"--chat-template-file": "/tmp/ünïcode.jinja"}),
    (["--jinja"] * 1 + ["-c", "1"] + ["--metrics"], {"--jinja": None, "--ctx-size": "1", "--metrics": None}),
]


@pytest.mark.parametrize(("args", "options"), ACCEPTED)
def test_accepted_extra_args(args, options):
    assert parse_extra_args(args) == options


REFUSED = [
    # owned flags in other forms (each spelling alone: test_every_owned_flag_spelling_is_refused)
    (["--port=9999"], "--port"),
    (["--jinja", "--model=/x"], "--model"),
    (["--exact-concurrency", "on"], "exact_concurrency"),
    # syntax
    (["--no-such-flag"], "unknown engine flag '--no-such-flag'"),
    (["-x"], "unknown engine flag '-x'"),
    (["ctx"], "unexpected value 'ctx'"),
    (["2048"], "unexpected value '2048'"),
    (["-c", "2048", "4096"], "unexpected value '4096'"),
    (["--help"], "unknown engine flag '--help'"),
    (["-fa=off"], "unknown engine flag '-fa=off'"),
    # arity
    (["-c"], "-c needs a value"),
    (["--ctx-size", "--jinja"], "--ctx-size needs a value"),
    (["-ctk"], "-ctk needs a value"),
    (["--jinja=yes"], "--jinja takes no value"),
    (["--metrics=1"], "--metrics takes no value"),
    (["--chat-template-file="], "--chat-template-file expects a non-empty value"),
    # values
    (["-c", "big"], "-c expects an integer"),
    (["-c", "-5"], "-c expects an integer >= 0"),
    (["-c", "1.5"], "-c expects an integer"),
    (["-b", "0"], "-b expects an integer >= 1"),
    (["-fa", "yes"], "-fa expects one of on, off, auto"),
    (["-ctk", "q3_k"], "-ctk expects one of"),
    (["--device", "tpu"], "--device expects one of auto, cuda, cpu"),
    (["--spec-type", "eagle"], "--spec-type expects one of none, ngram"),
    (["--cache-reuse", "-1"], "--cache-reuse expects an integer >= 0"),
    (["-s", "-2"], "-s expects an integer >= -1"),
    (["-ngl", "most"], "-ngl expects an integer"),
    (["-c", "99999999999999"], "-c expects an integer"),
    # repeats and contradictions
    (["-c", "1", "--ctx-size", "2"], "--ctx-size is given more than once"),
    (["--jinja", "--jinja"], "--jinja is given more than once"),
    (["--context-shift", "--no-context-shift"], "contradict"),
    # control characters, emptiness, limits
    (["--chat-template-file", "/tmp/a\nb"], "control character U+000A"),
    (["--chat-template-file", "/tmp/a\x00b"], "control character U+0000"),
    (["--chat-template-file", "/tmp/a\x1bb"], "control character U+001B"),
    (["--chat-template-file", "/tmp/a\u202eb"], "control character U+202E"),
    (["--jinja\t"], "control character U+0009"),
    ([""], "extra arg 1 is empty"),
    (["--chat-template-file", "x" * (MAX_ARG_CHARS + 1)], f"at most {MAX_ARG_CHARS}"),
    (["--jinja"] + ["--metrics"] * MAX_EXTRA_ARGS, f"at most {MAX_EXTRA_ARGS}"),
]


@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_refused_extra_args_name_the_problem(args, message):
    with pytest.raises(ExtraArgsError) as info:
        parse_extra_args(args)
    assert message in str(info.value)


def test_there_are_at_least_40_extra_args_cases():
    assert len(ACCEPTED) + len(REFUSED) >= 40


def test_limits_are_inclusive():
    assert parse_extra_args(["--chat-template-file", "x" * MAX_ARG_CHARS])
    # 64 args pass the count check (and then fail only for the repeat); 65 do not.
    with pytest.raises(ExtraArgsError, match="more than once"):
        parse_extra_args(["--jinja"] * MAX_EXTRA_ARGS)
    with pytest.raises(ExtraArgsError, match="too many"):
        parse_extra_args(["--jinja"] * (MAX_EXTRA_ARGS + 1))


def test_every_owned_flag_spelling_is_refused():
    assert {"-m", "--model", "--port", "--host", "--parallel", "-np", "--alias", "--api-key"} <= set(OWNED_FLAGS)
    for name in OWNED_FLAGS:
        args = [name] if not BY_NAME[name].takes_value else [name, "1"]
        with pytest.raises(ExtraArgsError, match="may not set " + name):
            parse_extra_args(args)


def test_flag_table_covers_the_engine_flags_of_the_design():
    design = ("--model --alias --host --port --ctx-size --parallel --batch-size --ubatch-size --kv-unified "
              "--flash-attn --n-gpu-layers --no-kv-offload --cache-type-k --cache-type-v --context-shift "
              "--no-context-shift --cache-reuse --spec-type --spec-draft-n-max --seed --api-key --metrics --jinja "
              "--chat-template-file --device --preempt-ram --exact-concurrency").split()
    compat = ("--temp --n-predict --threads --threads-batch --cont-batching --slots --no-slots --tags --no-jinja "
              "--chat-template --reasoning-format --reasoning --no-webui --verbose --slot-save-path --cache-ram "
              "--swa-full --spec-draft-n-min --backend-sampling --keep --sleep-idle-seconds --model-draft "
              "--gpu-layers-draft").split()  # llama-server's, engine/cli_compat.py
    gpus = "--tp --tensor-split --split-mode --main-gpu".split()  # engine/parallel
    assert sorted(design + compat + gpus) == sorted(f.canonical for f in FLAGS)
    for short in ("-m", "-c", "-np", "-b", "-ub", "-kvu", "-fa", "-ngl", "-nkvo", "-ctk", "-ctv", "-s"):
        assert short in BY_NAME


@pytest.mark.parametrize(("args", "codes"), [
    ([], []),
    (["--context-shift"], ["exact_context_shift"]),
    (["--cache-reuse", "256"], ["exact_cache_reuse"]),
    (["--cache-reuse", "0"], []),
    (["-nkvo"], ["exact_no_kv_offload"]),
    (["-ctk", "q8_0"], ["exact_kv_quantized"]),
    (["-ctv", "q4_0"], ["exact_kv_quantized"]),
    (["-ctk", "bf16", "-ctv", "f32"], []),
    (["-fa", "off"], ["exact_flash_attn_off"]),
    (["-fa", "on", "--no-context-shift"], []),
    (["--context-shift", "--cache-reuse", "1", "-nkvo", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off"],
     ["exact_context_shift", "exact_cache_reuse", "exact_no_kv_offload", "exact_kv_quantized",
      "exact_kv_quantized", "exact_flash_attn_off"]),
])
def test_exact_contradictions_are_named(args, codes):
    warnings = exact_contradictions(parse_extra_args(args))
    assert [w.code for w in warnings] == codes
    for w in warnings:
        assert w.flag in args or BY_NAME[w.flag].names[1] in args
        assert w.message


def test_load_fields_contradictions_are_named_too():
    options = options_from_settings(LoadDefaults(cache_type_k="q8_0", flash_attn="off"))
    assert [w.code for w in exact_contradictions(options)] == ["exact_kv_quantized", "exact_flash_attn_off"]


def test_options_from_settings_and_extra_args_replace_a_field():
    load = LoadDefaults(ctx_size=4096, parallel=2, batch_size=256, ubatch_size=64, flash_attn="on",
                        n_gpu_layers=10, spec_type="ngram", spec_draft_n_max=5, extra_args=["-c", "1024", "--jinja"])
    options = options_from_settings(load)
    assert options == {
        "--ctx-size": "1024", "--batch-size": "256", "--ubatch-size": "64", "--flash-attn": "on",
        "--cache-type-k": "f16", "--cache-type-v": "f16", "--spec-type": "ngram", "--spec-draft-n-max": "5",
        "--n-gpu-layers": "10", "--jinja": None,
    }
    assert "--n-gpu-layers" not in options_from_settings(LoadDefaults())
    assert "--spec-draft-n-max" not in options_from_settings(LoadDefaults())


OWNED = Owned("/models/tiny.gguf", "tiny", "127.0.0.1", 40123, 4)


def test_argv_exact_on_adds_kv_unified_and_the_mode():
    argv = compose_argv(OWNED, {"--ctx-size": "2048", "--jinja": None}, exact=True)
    assert argv == ["--model", "/models/tiny.gguf", "--alias", "tiny", "--host", "127.0.0.1", "--port", "40123",
                    "--parallel", "4", "--ctx-size", "2048", "--jinja", "--metrics",
                    "--kv-unified", "--exact-concurrency", "on"]


def test_argv_exact_off_passes_off_and_no_kv_unified():
    argv = compose_argv(OWNED, {"--ctx-size": "2048"}, exact=False)
    assert argv[-2:] == ["--exact-concurrency", "off"]
    assert "--kv-unified" not in argv


def test_argv_has_metrics_once():
    assert compose_argv(OWNED, {}, exact=False).count("--metrics") == 1
    assert compose_argv(OWNED, {"--metrics": None}, exact=False).count("--metrics") == 1


def test_argv_keeps_a_users_kv_unified_once():
    assert compose_argv(OWNED, {"--kv-unified": None}, exact=True).count("--kv-unified") == 1
    assert compose_argv(OWNED, {"--kv-unified": None}, exact=False).count("--kv-unified") == 1


def test_argv_never_carries_an_api_key_and_redaction_still_hides_one():
    assert "--api-key" not in compose_argv(OWNED, {}, exact=False)  # the key goes by environment (issue 25)
    shown = redact_argv(["--api-key", "secret", "--port", "1"])
    assert "secret" not in shown and shown[shown.index("--api-key") + 1] == "***"


@pytest.mark.parametrize(("inherited", "exact", "expected"), [
    (None, True, "1"), ("1", True, "1"), ("0", True, "1"),
    (None, False, None), ("1", False, None), ("0", False, None),
])
def test_child_env_sets_or_removes_lockstep_exact(inherited, exact, expected):
    base = {"PATH": "/bin", "HOME": "/h"}
    if inherited is not None:
        base["LOCKSTEP_EXACT"] = inherited
    env = child_env(base, exact, "park")
    assert env.get("LOCKSTEP_EXACT") == expected
    assert env["LOCKSTEP_PREEMPT_MODE"] == "park"
    assert env["PATH"] == "/bin" and env["HOME"] == "/h"
    assert base.get("LOCKSTEP_EXACT") == inherited  # the studio's own environment is left alone


def test_child_env_keeps_the_preempt_test_knob():
    env = child_env({"LOCKSTEP_PREEMPT_EVERY": "7", "LOCKSTEP_PREEMPT_MODE": "park"}, False, "recompute")
    assert env["LOCKSTEP_PREEMPT_EVERY"] == "7"
    assert env["LOCKSTEP_PREEMPT_MODE"] == "recompute"
