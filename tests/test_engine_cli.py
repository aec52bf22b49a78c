"""The engine's command line: every flag documented, and each failure's exit code and one-line message."""

import socket
import subprocess
import sys

import pytest

from engine.device import cuda_problem
from studio.failures import classify
from tests.engine_helpers import ROOT, engine_env, last_line, run_engine

DESIGN_FLAGS = [
    "-m", "--model", "--alias", "--host", "--port", "-c", "--ctx-size", "-np", "--parallel", "-b", "--batch-size",
    "-ub", "--ubatch-size", "-kvu", "--kv-unified", "-fa", "--flash-attn", "-ngl", "--n-gpu-layers", "-nkvo",
    "--no-kv-offload", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "--context-shift", "--no-context-shift",
    "--cache-reuse", "--spec-type", "--spec-draft-n-max", "-s", "--seed", "--api-key", "--metrics", "--jinja",
    "--chat-template-file", "--device", "--preempt-ram", "--exact-concurrency",
]


def test_help_documents_every_flag():
    r = run_engine(["--help"])
    assert r.returncode == 0
    for flag in DESIGN_FLAGS:
        assert f" {flag}" in r.stdout, flag
    assert "LOCKSTEP_EXACT=1" in r.stdout


def test_help_works_as_console_script_entry_too():
    r = subprocess.run([sys.executable, "-c", "import sys; from engine.cli import main; sys.exit(main(['-h']))"],
                       cwd=ROOT, env=engine_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--exact-concurrency" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ([], "the following arguments are required: -m/--model"),
    (["--parallel", "0"], "expects an integer >= 1"),
    (["--port", "http"], "expects an integer"),
    (["-fa", "maybe"], "invalid choice"),
    (["--device", "tpu"], "invalid choice"),
    (["-ngl", "some"], "expects an integer"),
    (["--exact-concurrency", "auto"], "invalid choice"),
    (["--context-shift", "--no-context-shift"], "not allowed with argument"),
])
def test_bad_command_lines_exit_2(tiny_llama, args, needle):
    model = [] if args == [] else ["-m", str(tiny_llama)]
    r = run_engine([*model, *args])
    assert r.returncode == 2
    assert needle in r.stderr


@pytest.mark.parametrize("args, line", [
    (["-ctk", "q4_0"], "error: --cache-type-k q4_0 is not supported (supported: f32, f16, bf16, q8_0)"),
    (["-ctv", "iq4_nl"], "error: --cache-type-v iq4_nl is not supported (supported: f32, f16, bf16, q8_0)"),
    (["-ctk", "f8"], "error: --cache-type-k 'f8' is not a cache type (supported: f32, f16, bf16, q8_0)"),
    (["-fa", "off"], "error: -fa off is not supported yet (the paged flash kernel is the only attention); "
                     "use -fa on or auto"),
    (["--cache-reuse", "256"], "error: --cache-reuse is not supported yet; prompt caching at the same positions "
                               "is always on"),
    (["--spec-type", "ngram", "--spec-draft-n-max", "0"], "error: --spec-type ngram needs --spec-draft-n-max >= 1"),
    (["--chat-template-file", "/nonexistent/t.jinja"], "error: --chat-template-file /nonexistent/t.jinja: cannot "
                                                       "be read"),
    (["--device", "cuda", "-ngl", "0"], "error: --device cuda with -ngl 0 puts no layer on the GPU; use -ngl all, "
                                        "or --device cpu"),
])
def test_unsupported_values_are_explicit_errors(tiny_llama, args, line):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cpu", *args])
    assert r.returncode == 2, r.stderr
    assert last_line(r.stderr).startswith(line)


def test_missing_model_exits_4(tmp_path):
    r = run_engine(["-m", str(tmp_path / "nope"), "--port", "0", "--device", "cpu"])
    assert r.returncode == 4
    assert last_line(r.stderr) == f"error: model load failed: {tmp_path / 'nope'}: no such file or directory"
    assert classify(r.stderr, r.returncode).kind == "bad_model"


def test_damaged_model_exits_4(tiny_llama, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_llama.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "config.json").write_text("{not json")
    r = run_engine(["-m", str(bad), "--port", "0", "--device", "cpu"])
    assert r.returncode == 4
    assert last_line(r.stderr).startswith("error: model load failed: config.json: not valid JSON")


def test_port_in_use_exits_8(tiny_llama):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_engine(["-m", str(tiny_llama), "--port", str(port), "--device", "cpu"])
    assert r.returncode == 8
    assert last_line(r.stderr).startswith(f"error: cannot bind 127.0.0.1:{port}: ")
    assert classify(r.stderr, r.returncode).kind == "port_in_use"


def test_pool_larger_than_memory_exits_5(tiny_llama):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cpu", "-c", "4000000000"])
    assert r.returncode == 5
    line = last_line(r.stderr)
    assert line.startswith("error: out of memory: needs ") and line.endswith(" GiB free")
    assert classify(r.stderr, r.returncode).kind == "out_of_memory"


@pytest.mark.skipif(cuda_problem() is None, reason="a CUDA device works here")
def test_device_cuda_without_a_usable_gpu_exits_6(tiny_llama):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cuda"])
    assert r.returncode == 6
    assert last_line(r.stderr).startswith("error: no usable CUDA device: ")
    assert classify(r.stderr, r.returncode).kind == "no_cuda"


def test_logs_carry_timestamps_so_they_never_read_as_a_verdict(tmp_path):
    r = run_engine(["-m", str(tmp_path / "missing"), "--port", "0", "--device", "cpu"])
    logs = [ln for ln in r.stderr.splitlines() if "exact concurrency: off (not requested)" in ln]
    assert logs and all(ln[:4].isdigit() for ln in logs)  # "2026-..." first
    assert classify(r.stderr, r.returncode).kind == "bad_model"  # not taken for an exact refusal


def test_generate_streams_a_greedy_completion(tiny_llama_noeos):
    args = ["generate", "-m", str(tiny_llama_noeos), "-p", "Hello world", "-n", "12", "--temp", "0",
            "--device", "cpu"]
    first, second = run_engine(args), run_engine(args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stdout.strip()
    assert "finish_reason=length" in first.stderr and "completion_tokens=12" in first.stderr


def test_sigterm_stops_a_ready_engine_cleanly(engine_factory, tiny_llama):
    eng = engine_factory(tiny_llama)
    eng.proc.terminate()
    assert eng.proc.wait(20) == 0
    assert "shutting down" in eng.output()


def test_cuda_memory_plan_counts_weights_pool_and_work(tiny_llama):
    from engine.launch import memory_need
    from engine.loader import load_model
    from lockstep_kernels.cuda.weights import device_bytes

    loaded = load_model(tiny_llama)
    cpu = memory_need(loaded, "cpu", 4, "f16")
    cuda = memory_need(loaded, "cuda", 4, "f16")
    assert cpu == {"kv": cuda["kv"]}
    assert cuda["weights"] == sum(device_bytes(w) for w in loaded.weights.values())
    assert cuda["work"] > 0 and cuda["logits"] == 4 * 512 * loaded.config.vocab_size
    assert memory_need(loaded, "cuda", 8, "f16")["kv"] == 2 * cuda["kv"]
