"""The launcher and its relaunch ladder, against a scripted stand-in engine process.

The real CPU engine cannot be made to run out of memory, or lack CUDA on demand, so
these tests spawn a small stand-in that speaks the engine's command line, failure lines, exit codes
and /health + /props. The real engine is exercised in test_studio_integration.py.
"""

import os

import pytest

from settings import LoadDefaults
from studio.engine_child import granted_from_props, stop_process
from studio.failures import Failure
from studio.flags import options_from_settings
from studio.ladder import next_step
from studio.launcher import Launcher, LaunchFailed
from studio.load_plan import LaunchPlan
from tests.test_studio_standin import standin_fixture  # noqa: F401  (the standin fixture)


def plan(exact="auto", extra=(), model="/models/tiny.gguf", native=None, **load):
    options = options_from_settings(LoadDefaults(extra_args=list(extra), **load))
    return LaunchPlan(model, "tiny", 2, options, exact, "auto", native)


def launcher(tmp_path, standin, **env):
    return Launcher(tmp_path / "logs", standin.env(**env), standin.cmd, health_timeout_s=30)


def argv_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


async def test_healthy_launch_reads_props(tmp_path, standin):
    result = await launcher(tmp_path, standin, STANDIN_LOADING_POLLS=3).launch(plan("on"))
    try:
        child = result.child
        assert child.alive and child.exact and child.env_exact
        assert granted_from_props(child.props) == (True, None)
        assert [a.outcome for a in result.attempts] == ["ready"]
        call = standin.calls()[0]
        assert call["LOCKSTEP_EXACT"] == "1" and call["LOCKSTEP_PREEMPT_MODE"] == "auto"
        assert argv_value(call["argv"], "--port") == str(child.port)
        assert "--kv-unified" in call["argv"]
        assert child.api_key and child.api_key not in call["argv"] and "--api-key" not in call["argv"]
        log = (tmp_path / "logs").glob("engine-*-attempt1.log")
        text = next(log).read_text()
        assert "standin listening" in text and "# argv:" in text and child.api_key not in text
    finally:
        await stop_process(result.child.process)
    assert not result.child.alive


async def test_exact_off_removes_an_inherited_lockstep_exact(tmp_path, standin):
    result = await launcher(tmp_path, standin, LOCKSTEP_EXACT="1").launch(plan("off"))
    await stop_process(result.child.process)
    call = standin.calls()[0]
    assert call["LOCKSTEP_EXACT"] is None
    assert argv_value(call["argv"], "--exact-concurrency") == "off"
    assert not result.child.exact and not result.child.env_exact


async def test_auto_relaunches_once_without_exact_after_a_refusal(tmp_path, standin):
    result = await launcher(tmp_path, standin).launch(plan("auto", ["-ctk", "q8_0"]))
    await stop_process(result.child.process)
    assert [a.outcome for a in result.attempts] == ["exact_refusal", "ready"]
    assert result.exact_dropped.line.startswith("exact concurrency: KV cache type q8_0")
    assert "without exact concurrency" in result.attempts[1].change
    calls = standin.calls()
    assert [argv_value(c["argv"], "--exact-concurrency") for c in calls] == ["on", "off"]
    assert [c["LOCKSTEP_EXACT"] for c in calls] == ["1", None]
    assert len(list((tmp_path / "logs").glob("engine-*.log"))) == 2  # one log per attempt


async def test_on_turns_the_refusal_into_a_message_naming_setting_and_requirement(tmp_path, standin):
    with pytest.raises(LaunchFailed) as info:
        await launcher(tmp_path, standin).launch(plan("on", ["-ctk", "q8_0"]))
    message = info.value.message
    assert "exact_concurrency is on" in message
    assert "KV cache type q8_0 is not supported; use -ctk f16 (or bf16)" in message
    assert info.value.failure.kind == "exact_refusal"
    assert len(standin.calls()) == 1


async def test_out_of_memory_halves_the_context(tmp_path, standin):
    result = await launcher(tmp_path, standin, STANDIN_MAX_CTX=1500).launch(plan("off", ctx_size=4096))
    await stop_process(result.child.process)
    assert [argv_value(c["argv"], "--ctx-size") for c in standin.calls()] == ["4096", "2048", "1024"]
    assert [a.outcome for a in result.attempts] == ["out_of_memory", "out_of_memory", "ready"]
    assert result.options["--ctx-size"] == "1024"


async def test_out_of_memory_with_native_context_halves_the_native_one(tmp_path, standin):
    env = dict(STANDIN_MAX_CTX=3000, STANDIN_NATIVE_CTX=8192)
    result = await launcher(tmp_path, standin, **env).launch(plan("off", ctx_size=0, native=8192))
    await stop_process(result.child.process)
    assert [argv_value(c["argv"], "--ctx-size") for c in standin.calls()] == ["0", "4096", "2048"]


async def test_no_cuda_falls_back_to_the_cpu(tmp_path, standin):
    result = await launcher(tmp_path, standin, STANDIN_NO_CUDA=1).launch(plan("on"))
    await stop_process(result.child.process)
    assert [a.outcome for a in result.attempts] == ["no_cuda", "ready"]
    assert argv_value(standin.calls()[1]["argv"], "--device") == "cpu"
    assert result.child.exact  # the CPU backend has exact mode too


async def test_the_ladder_runs_in_order_and_stops_at_four_attempts(tmp_path, standin):
    env = dict(STANDIN_NO_CUDA=1, STANDIN_MAX_CTX=100)
    with pytest.raises(LaunchFailed) as info:
        await launcher(tmp_path, standin, **env).launch(plan("auto", ["-ctk", "q8_0"], ctx_size=4096))
    kinds = [a.outcome for a in info.value.attempts]
    assert kinds == ["no_cuda", "exact_refusal", "out_of_memory", "out_of_memory"]
    assert len(standin.calls()) == 4
    assert "gave up after 4 attempts" in info.value.message


@pytest.mark.parametrize(("env", "kind", "text"), [
    ({"STANDIN_CRASH": 1}, "crash", "RuntimeError: stand-in crash"),
    ({"STANDIN_EXIT0": 1}, "crash", "exited with code 0"),
])
async def test_other_failures_are_final_and_classified(tmp_path, standin, env, kind, text):
    with pytest.raises(LaunchFailed) as info:
        await launcher(tmp_path, standin, **env).launch(plan("off"))
    assert info.value.failure.kind == kind
    assert text in info.value.message
    assert len(info.value.attempts) == 1


async def test_bad_model_is_final(tmp_path, standin):
    with pytest.raises(LaunchFailed) as info:
        await launcher(tmp_path, standin).launch(plan("auto", model="/models/broken.gguf"))
    assert info.value.failure.kind == "bad_model"
    assert "unsupported architecture 'broken'" in info.value.message


async def test_health_deadline_kills_the_child(tmp_path, standin):
    fast = Launcher(tmp_path / "logs", standin.env(STANDIN_HANG=1), standin.cmd, health_timeout_s=1.5)
    with pytest.raises(LaunchFailed) as info:
        await fast.launch(plan("off"))
    assert info.value.failure.kind == "timeout"
    assert "within 1.5 s" in info.value.message
    pid = standin.calls()[0]["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_next_step_is_final_when_nothing_is_left_to_change():
    base = plan("off", ["-fa", "off", "--device", "cpu"], ctx_size=256)
    for kind in ("no_cuda", "out_of_memory", "port_in_use", "crash", "bad_model"):
        step = next_step(base, base.options, False, Failure(kind, 1, None, "x"))
        assert isinstance(step, str), kind


@pytest.mark.parametrize(("props", "expected"), [
    ({"exact_concurrency": {"granted": True}}, (True, None)),
    ({"exact_concurrency": {"granted": "on"}}, (True, None)),
    ({"exact_concurrency": {"granted": False, "reason": "r"}}, (False, "r")),
    ({"exact_concurrency": {"requested": True}}, (None, None)),
    ({"exact_concurrency": None}, (None, None)),
    ({}, (None, None)),
    ({"exact_concurrency": {"granted": 1}}, (False, None)),
])
def test_granted_from_props(props, expected):
    assert granted_from_props(props) == expected


async def test_each_attempt_is_told_as_it_starts(tmp_path, standin):
    started = []
    ladder = launcher(tmp_path, standin, STANDIN_MAX_CTX=1500)
    ladder.on_attempt = lambda a: started.append((a.number, a.change, a.outcome))
    result = await ladder.launch(plan("off", ctx_size=4096))
    await stop_process(result.child.process)
    assert [n for n, _, _ in started] == [1, 2, 3]
    assert all(outcome == "running" for _, _, outcome in started)  # told before the attempt ended
    assert started[0][1] is None and "2048" in started[1][1]
