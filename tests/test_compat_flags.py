"""llama-server flags and fields (issues 27/34): a real engine child per launch, checked over HTTP."""

import socket
import urllib.error
import urllib.request

import pytest

from tests.engine_helpers import last_line, run_engine


def _get(eng, path):
    try:
        with urllib.request.urlopen(eng.base + path, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_aliases_tags_slots_off_and_props(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos, "--alias", "zeta,alpha,code", "--tags", "chat,small", "--no-slots",
                         "--temp", "0", "-n", "3", "--metrics")
    card = eng.get_json("/v1/models")["data"][0]
    assert card["id"] == "alpha"  # the first alias in sorted order, as llama-server
    assert set(card["aliases"]) == {"zeta", "alpha", "code"} and set(card["tags"]) == {"chat", "small"}
    status, _, body = _get(eng, "/slots")
    assert status == 501 and "slots" in body
    props = eng.get_json("/props")
    assert props["build_info"].startswith("b0-lockstep-") and props["lockstep_build"].startswith("lockstep ")
    assert props["is_sleeping"] is False
    assert props["default_generation_settings"]["params"]["temperature"] == 0.0
    assert props["default_generation_settings"]["params"]["n_predict"] == 3
    # -n is the limit of a request that sets none; one that sets its own keeps it (llama-server's)
    import json
    for body, n in (({"prompt": "def f(x):"}, 3), ({"prompt": "def f(x):", "n_predict": 5}, 5)):
        req = urllib.request.Request(eng.base + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        assert out["timings"]["predicted_n"] == n and out["generation_settings"]["n_predict"] == n
    status, headers, text = _get(eng, "/metrics")
    assert status == 200 and int(headers["Process-Start-Time-Unix"]) > 0
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
                 "llamacpp:requests_processing", "lockstep:pages_total"):
        assert f"\n{name} " in "\n" + text, name
    assert "\nllamacpp:tokens_predicted_total 8\n" in "\n" + text  # the two completions above


def test_slot_below_one_page_is_refused_naming_the_flags(tiny_llama):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cpu", "-c", "512", "-np", "4"])
    assert r.returncode == 2
    line = last_line(r.stderr)
    assert "-c 512 with -np 4 gives each slot 128 tokens" in line and "-kvu" in line


def test_slot_context_is_ctx_over_parallel(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos, "-c", "1000", "-np", "2")  # the pool rounds up to 1024
    assert eng.get_json("/props")["default_generation_settings"]["n_ctx"] == 500
    assert {s["n_ctx"] for s in eng.get_json("/slots")} == {500}


@pytest.mark.parametrize("flag,reason", [(["--lora", "x.gguf"], "LoRA adapters are not supported"),
                                         (["--grp-attn-n", "4"], "self-extend"),
                                         (["-devd", "CUDA1"], "settings of the draft model are not supported: "
                                                              "-md PATH runs it on the model's backend"),
                                         (["--device-draft=CUDA1", "-ctkd", "q8_0"], "--device-draft, -ctkd: settings")])
def test_llama_server_flag_we_lack_is_named_with_its_reason(tiny_llama, flag, reason):
    r = run_engine(["-m", str(tiny_llama), "--port", "0", "--device", "cpu", *flag])
    assert r.returncode == 2 and flag[0] in r.stderr and reason in r.stderr


def test_accepted_llama_server_flags_start(engine_factory, tiny_llama_noeos, tmp_path):
    eng = engine_factory(tiny_llama_noeos, "-t", "2", "-cb", "--no-webui", "--no-jinja", "--cache-ram", "0",
                         "--swa-full", "--slot-save-path", str(tmp_path), "--reasoning-format", "none",
                         "--chat-template", "llama3", "--verbose")
    import json
    req = urllib.request.Request(eng.base + "/v1/chat/completions", data=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    # --chat-template llama3 (a built-in name) rendered the prompt; --verbose shows it
    assert out["__verbose"]["prompt"].endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "params" in eng.get_json("/slots")[0]  # --verbose shows the slots' parameters


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_several_hosts(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos, "--host", "127.0.0.1,::1")
    with urllib.request.urlopen(f"http://[::1]:{eng.port}/health", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{eng.port}/health", timeout=10) as r:
        assert r.status == 200
