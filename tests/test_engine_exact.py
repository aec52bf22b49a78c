"""Exact mode's preconditions (one refusal each: exit 3, one line, the flag that fixes it) and its report."""

import json
import shutil
import subprocess
import sys
import urllib.request

import pytest

from studio.failures import classify
from tests.engine_helpers import ROOT, engine_env, last_line, run_engine

# The CUDA-only preconditions are checked before any CUDA code runs, so a CPU machine can test them by
# making the device probe report a working GPU.
AS_IF_CUDA = "import engine.device as d; d.cuda_problem = lambda: None\n"
SOFTCAP = (
    "import engine.loader.hf as hf\n"
    "_read = hf.read_config\n"
    "def read(p):\n"
    "    c = _read(p); c.attn_softcap = 30.0; return c\n"
    "hf.read_config = read\n"
)


def run_patched(patch: str, args: list[str], env=None) -> subprocess.CompletedProcess:
    code = patch + "import sys\nfrom engine.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=engine_env(env),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sliding_model(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("sliding") / "mistral-sw"
    shutil.copytree(tiny_llama, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=128)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def assert_refused(r: subprocess.CompletedProcess, line: str, fix: str) -> None:
    assert r.returncode == 3, r.stderr
    assert last_line(r.stderr) == line
    failure = classify(r.stderr, r.returncode)
    assert failure.kind == "exact_refusal" and failure.fix == fix


def base(model) -> list[str]:
    return ["-m", str(model), "--port", "0", "--exact-concurrency", "on"]


def test_quantized_k_cache_is_refused(tiny_llama):
    r = run_engine([*base(tiny_llama), "--device", "cpu", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert_refused(r, "exact concurrency: KV cache type q8_0 is not supported; use -ctk f16 (or bf16)",
                   "-ctk f16 (or bf16)")


def test_quantized_v_cache_is_refused(tiny_llama):
    r = run_engine([*base(tiny_llama), "--device", "cpu", "-ctv", "q8_0"])
    assert_refused(r, "exact concurrency: KV cache type q8_0 is not supported; use -ctv f16 (or bf16)",
                   "-ctv f16 (or bf16)")


def test_flash_attention_off_is_refused(tiny_llama):
    r = run_engine([*base(tiny_llama), "--device", "cpu", "-fa", "off"])
    assert_refused(r, "exact concurrency: flash attention off (-fa off) is not supported: the paged kernel is "
                      "flash-style; use -fa on", "-fa on")


def test_partial_gpu_offload_is_refused(tiny_llama):
    r = run_patched(AS_IF_CUDA, [*base(tiny_llama), "--device", "cuda", "-ngl", "1"])
    assert_refused(r, "exact concurrency: partial GPU offload (-ngl 1 of 2 layers) is not supported; use -ngl all",
                   "-ngl all")


def test_kv_cache_off_the_gpu_is_refused_on_cuda(tiny_llama):
    r = run_patched(AS_IF_CUDA, [*base(tiny_llama), "--device", "cuda", "-nkvo"])
    assert_refused(r, "exact concurrency: a KV cache kept in host memory (--no-kv-offload) is not supported on "
                      "CUDA; use the default KV offload (drop -nkvo)", "the default KV offload (drop -nkvo)")


def test_sliding_window_attention_is_refused(sliding_model):
    r = run_engine([*base(sliding_model), "--device", "cpu"])
    assert_refused(r, "exact concurrency: sliding-window attention (window 128) is not covered by the paged "
                      "kernel; use --exact-concurrency off", "--exact-concurrency off")


def test_soft_capped_attention_is_refused(tiny_llama):
    r = run_patched(SOFTCAP, [*base(tiny_llama), "--device", "cpu"])
    assert_refused(r, "exact concurrency: attention soft-capping (cap 30.0) is not covered by the paged kernel; "
                      "use --exact-concurrency off", "--exact-concurrency off")


def test_environment_twin_asks_for_exact_mode(tiny_llama):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cpu", "-ctk", "q8_0", "-ctv", "q8_0"],
                   env={"LOCKSTEP_EXACT": "1"})
    assert r.returncode == 3
    assert last_line(r.stderr).startswith("exact concurrency: KV cache type q8_0")


def test_on_reports_granted_and_disables_shifting_with_warnings(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama, "--exact-concurrency", "on", "--context-shift", "--cache-reuse", "256")
    props = eng.get_json("/props")
    assert props["exact_concurrency"] == {"requested": True, "granted": True, "reason": None, "page_size": 256,
                                          "backend": "cpu"}
    out = eng.output()
    assert "exact concurrency: on (backend=cpu, page_size=256)" in out
    assert "WARNING engine.exact: exact concurrency: --context-shift disabled" in out
    assert "WARNING engine.exact: exact concurrency: --cache-reuse 256 disabled" in out


def test_flag_off_wins_over_the_environment(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama, "--exact-concurrency", "off", "-ctk", "q8_0",
                         env={"LOCKSTEP_EXACT": "1"})
    ec = eng.get_json("/props")["exact_concurrency"]
    assert ec["requested"] is False and ec["granted"] is False and ec["reason"] == "not requested"
    assert "exact concurrency: off (not requested)" in eng.output()
    # a q8_0 K cache beside an f16 V cache serves requests
    body = json.dumps({"prompt": [5, 6, 7], "n_predict": 4, "temperature": 0, "return_tokens": True}).encode()
    req = urllib.request.Request(eng.base + "/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert len(json.loads(r.read())["tokens"]) == 4
