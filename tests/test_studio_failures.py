"""Classification of engine failures from the engine's one-line messages and exit codes."""

import pytest

from studio.failures import classify

TRACEBACK = """Traceback (most recent call last):
  File "/x/engine/cli.py", line 10, in main
    run()
RuntimeError: something broke
"""


@pytest.mark.parametrize(("output", "code", "kind", "detail"), [
    ("exact concurrency: KV cache type q8_0 is not supported; use -ctk f16 (or bf16)\n", 3, "exact_refusal",
     "KV cache type q8_0 is not supported; use -ctk f16 (or bf16)"),
    ("exact concurrency: flash attention off is not supported; use -fa on\n", 3, "exact_refusal",
     "flash attention off is not supported; use -fa on"),
    ("exact concurrency: partial GPU offload (-ngl 10 of 32 layers) is not supported; use -ngl 99\n", 3,
     "exact_refusal", "partial GPU offload (-ngl 10 of 32 layers) is not supported; use -ngl 99"),
    ("error: model load failed: unsupported architecture 'gemma3'\n", 4, "bad_model",
     "unsupported architecture 'gemma3'"),
    ("error: model load failed: tensor type IQ2_XS is not supported\n", 4, "bad_model",
     "tensor type IQ2_XS is not supported"),
    ("error: out of memory: needs 14.2 GiB, 7.9 GiB free\n", 5, "out_of_memory", "needs 14.2 GiB, 7.9 GiB free"),
    ("error: no usable CUDA device: cupy is not installed\n", 6, "no_cuda", "cupy is not installed"),
    ("error: cannot bind 127.0.0.1:8080: [Errno 98] Address already in use\n", 8, "port_in_use",
     "127.0.0.1:8080: [Errno 98] Address already in use"),
])
def test_engine_messages(output, code, kind, detail):
    failure = classify(output, code)
    assert (failure.kind, failure.detail, failure.exit_code) == (kind, detail, code)
    assert failure.line == output.strip()


def test_message_decides_over_exit_code():
    # An engine bug could exit 1 after printing its verdict; the verdict still names the cause.
    assert classify("error: out of memory: needs 3 GiB, 1 GiB free\n", 1).kind == "out_of_memory"
    assert classify("exact concurrency: KV cache type q4_0 is not supported; use -ctk f16\n", 5).kind == "exact_refusal"


def test_message_is_found_after_log_noise_and_the_last_verdict_wins():
    output = ("loading model from /m/tiny.gguf\nINFO: page size 256\n"
              "error: no usable CUDA device: driver too old\n"
              "retrying...\n"
              "error: out of memory: needs 2 GiB, 1 GiB free\n"
              "bye\n")
    failure = classify(output, 5)
    assert failure.kind == "out_of_memory"
    assert failure.detail == "needs 2 GiB, 1 GiB free"


def test_windows_line_endings_and_indentation():
    assert classify("  error: model load failed: no config.json\r\n", 4).detail == "no config.json"


def test_bad_flags_needs_exit_code_2():
    line = "error: -ctk q8_0 with -ctv f16: different K and V cache types are not supported yet"
    failure = classify("usage: lockstep-engine ...\n" + line + "\n", 2)
    assert (failure.kind, failure.line) == ("bad_flags", line)
    assert failure.detail.startswith("-ctk q8_0 with -ctv f16")
    assert classify(line + "\n", 1).kind == "crash"  # the same words with another code are no verdict


@pytest.mark.parametrize(("code", "kind"), [(2, "bad_flags"), (3, "exact_refusal"), (4, "bad_model"), (5, "out_of_memory"),
                                            (6, "no_cuda"), (8, "port_in_use")])
def test_exit_code_is_the_fallback_without_a_message(code, kind):
    failure = classify("some unrelated output\n", code)
    assert failure.kind == kind
    assert failure.line is None
    assert f"exit code {code}" in failure.detail


def test_fix_flag_of_an_exact_refusal():
    failure = classify("exact concurrency: KV cache type q8_0 is not supported; use -ctk f16 (or bf16)", 3)
    assert failure.fix == "-ctk f16 (or bf16)"
    assert classify("error: out of memory: x", 5).fix is None


@pytest.mark.parametrize(("output", "code", "detail_part"), [
    (TRACEBACK, 1, "exited with code 1: RuntimeError: something broke"),
    ("", -9, "killed by SIGKILL"),
    ("", -11, "killed by SIGSEGV"),
    ("Segmentation fault\n", 139, "code 139: Segmentation fault"),
    ("", 0, "exited with code 0"),
    ("all good so far\n", None, "still running"),
    # look-alikes that are not the engine's verdict
    ("warning: exact concurrency disabled for this request\n", 1, "warning: exact concurrency disabled"),
    ("INFO error: out of memory: in a log prefix\n", 1, "INFO error: out of memory"),
    ("error: model load failed:\n", 1, "error: model load failed:"),
])
def test_everything_else_is_a_crash(output, code, detail_part):
    failure = classify(output, code)
    assert failure.kind == "crash"
    assert detail_part in failure.detail


def test_traceback_mentioning_a_pattern_inside_a_line_is_not_a_verdict():
    out = 'ValueError: "exact concurrency: q8_0" was raised inside\n'
    assert classify(out, 1).kind == "crash"
