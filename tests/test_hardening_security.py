"""Issue 25, security: no way in through the studio from a web page, and no key in a process list.

Every case runs against a real `lockstep serve` process and its real engine child on the CPU backend,
with raw HTTP so Host headers and paths go out exactly as an attacker's browser would send them.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.engine_helpers import Engine, run_engine
from tests.studio_helpers import Studio, cmdline, environ, raw

CPU = ["--device", "cpu"]
EVIL = "http://evil.example"
APP = "http://app.example"
PASSWD = ["--chat-template-file", "/etc/passwd"]


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_llama):
    """A studio without a key (the default) with the tiny llama loaded."""
    d = tmp_path_factory.mktemp("open-studio")
    s = Studio(d / "config", d / "logs", models=tiny_llama.parent).wait_ready()
    code, body = s.call("POST", "/api/load", {"model": tiny_llama.name, "extra_args": CPU, "ctx_size": 1024})
    assert code == 200, body
    s.loaded, s.model = body, tiny_llama.name
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, tiny_llama):
    """A studio started with --api-key-file and one configured CORS origin."""
    d = tmp_path_factory.mktemp("keyed-studio")
    key_file = d / "key"
    key_file.write_text("studio-secret-key\n")
    key_file.chmod(0o600)
    s = Studio(d / "config", d / "logs", "--api-key-file", str(key_file), "--cors-origin", APP,
               models=tiny_llama.parent, key="studio-secret-key").wait_ready()
    s.dir, s.model = d, tiny_llama.name
    yield s
    s.stop()


def error_type(payload: bytes) -> str:
    return json.loads(payload)["error"]["type"]


def engine_pid(s: Studio) -> int:
    return s.call("GET", "/api/status")[1]["pid"]


# --- Host allow-list ------------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path"), [("GET", "/api/status"), ("GET", "/api/models"),
                                              ("GET", "/api/settings"), ("GET", "/v1/models"),
                                              ("POST", "/api/unload")])
def test_a_rebinding_host_is_refused(studio, method, path):
    code, _, payload = raw(studio.port, method, path, host=f"rebind.evil.example:{studio.port}")
    assert code == 403 and error_type(payload) == "forbidden_host"
    assert engine_pid(studio) == studio.loaded["pid"]  # the unload never ran


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}",
                                  "localhost"])
def test_loopback_hosts_are_accepted(studio, host):
    code, _, payload = raw(studio.port, "GET", "/api/status", host=host.format(port=studio.port))
    assert code == 200 and json.loads(payload)["state"] == "ready"


# --- the issue's reproduction, step by step -------------------------------------------------------

def test_the_issue_reproduction_is_refused_at_every_step(studio):
    body = json.dumps({"model": studio.model, "extra_args": CPU + PASSWD})
    port = studio.port
    steps = [
        ({"Origin": EVIL, "Content-Type": "text/plain"}, f"rebind.evil.example:{port}", 403, "forbidden_host"),
        ({"Origin": EVIL, "Content-Type": "text/plain"}, None, 403, "forbidden_origin"),
        ({"Content-Type": "text/plain"}, None, 415, "unsupported_media_type"),
        ({"Content-Type": "application/json"}, None, 403, "forbidden_flag"),
    ]
    for headers, host, want, kind in steps:
        code, _, payload = raw(port, "POST", "/api/load", body, headers, host=host)
        assert (code, error_type(payload)) == (want, kind), payload
    assert engine_pid(studio) == studio.loaded["pid"]  # nothing was reloaded
    code, _, payload = raw(port, "GET", "/v1/%2e%2e/props")
    assert code == 404 and b"root:" not in payload and b"chat_template" not in payload


@pytest.mark.parametrize("path", ["/v1/%2e%2e/props", "/v1/%2E%2E/slots", "/v1/../props", "/v1/./../props",
                                  "/v1/models/..%2f..%2fprops", "/v1/models/%2e%2e", "/v1/Chat/Completions",
                                  "/v1/CHAT/COMPLETIONS", "/v1/MODELS", "/v1/tokenize", "/v1/chat/completions/..",
                                  "/v1/%2e%2e/metrics"])
def test_the_proxy_forwards_only_known_paths(studio, path):
    code, _, payload = raw(studio.port, "GET", path)
    assert code == 404, payload
    assert b"n_ctx" not in payload and b"chat_template" not in payload and b"tokens_" not in payload


def test_the_proxy_still_forwards_the_api(studio):
    code, _, payload = raw(studio.port, "GET", "/v1/models")
    assert code == 200 and studio.model in [m["id"] for m in json.loads(payload)["data"]]
    code, _, payload = raw(studio.port, "GET", f"/v1/models/{studio.model}")
    assert code == 200 and json.loads(payload)["id"] == studio.model
    code, body = studio.call("POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert code == 200 and body["choices"][0]["message"]["role"] == "assistant"


# --- Origin, content type, CORS -------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/api/unload", {}), ("PUT", "/api/settings", {"preempt_mode": "park"}),
    ("PUT", "/api/settings/exact-concurrency", {"exact_concurrency": "on"}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
])
def test_a_foreign_origin_may_not_change_anything(studio, method, path, body):
    before = studio.call("GET", "/api/settings")[1]["settings"]
    for origin in (EVIL, f"http://localhost:{studio.port + 1}", "null"):
        code, _ = studio.call(method, path, body, headers={"Origin": origin})
        assert code == 403
    assert studio.call("GET", "/api/settings")[1]["settings"] == before
    assert engine_pid(studio) == studio.loaded["pid"]


def test_the_studios_own_origin_may(studio):
    code, body = studio.call("PUT", "/api/settings", {"health_timeout_s": 120},
                             headers={"Origin": f"http://127.0.0.1:{studio.port}"})
    assert code == 200 and body["settings"]["health_timeout_s"] == 120


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_mutations_take_json_only(studio, content_type):
    code, _, payload = raw(studio.port, "PUT", "/api/settings", '{"preempt_mode": "recompute"}',
                           {"Content-Type": content_type})
    assert code == 415 and error_type(payload) == "unsupported_media_type"
    assert studio.call("GET", "/api/settings")[1]["settings"]["preempt_mode"] != "recompute"


def test_no_cors_grant_without_configured_origins(studio):
    preflight = {"Origin": APP, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    code, headers, _ = raw(studio.port, "OPTIONS", "/api/load", headers=preflight)
    assert code == 403 and "access-control-allow-origin" not in headers
    code, headers, _ = raw(studio.port, "GET", "/api/status", headers={"Origin": APP})
    assert code == 200 and "access-control-allow-origin" not in headers


def test_a_configured_origin_gets_cors_and_others_do_not(keyed):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    code, headers, _ = raw(keyed.port, "OPTIONS", "/api/load", headers={"Origin": APP, **preflight})
    assert code == 204 and headers["access-control-allow-origin"] == APP
    assert "Authorization" in headers["access-control-allow-headers"]
    code, headers, _ = raw(keyed.port, "OPTIONS", "/api/load", headers={"Origin": EVIL, **preflight})
    assert code == 403 and "access-control-allow-origin" not in headers
    code, headers, _ = raw(keyed.port, "GET", "/api/status", headers=keyed.headers({"Origin": APP}))
    assert code == 200 and headers["access-control-allow-origin"] == APP
    code, _ = keyed.call("PUT", "/api/settings", {"preempt_mode": "park"}, headers={"Origin": APP})
    assert code == 200  # a granted origin may also change things (with the key)


# --- what the API may not change ------------------------------------------------------------------

@pytest.mark.parametrize("patch", [{"api": {"port": 9999}}, {"api": {"host": "0.0.0.0"}},
                                   {"api": {"host": "localhost"}}, {"api": {"cors_origins": [EVIL]}},
                                   {"load": {"extra_args": PASSWD}}])
def test_without_a_key_the_api_cannot_move_or_widen_the_studio(studio, patch):
    path = studio.call("GET", "/api/settings")[1]["path"]
    before = open(path, "rb").read() if os.path.exists(path) else None
    code, body = studio.call("PUT", "/api/settings", patch)
    assert code == 403 and body["error"]["type"] == "forbidden_setting"
    assert (open(path, "rb").read() if os.path.exists(path) else None) == before


def test_with_a_key_the_api_may_move_the_studio_but_never_off_loopback(keyed):
    code, body = keyed.call("PUT", "/api/settings", {"api": {"port": 9999, "host": "localhost"}})
    assert code == 200 and (body["settings"]["api"]["port"], body["settings"]["api"]["host"]) == (9999, "localhost")
    for host in ("0.0.0.0", "192.168.1.5", "::", "evil.example"):
        code, body = keyed.call("PUT", "/api/settings", {"api": {"host": host}})
        assert code == 403 and "loopback" in body["error"]["message"]
    assert keyed.call("GET", "/api/settings")[1]["settings"]["api"]["host"] == "localhost"


# --- keys never in argv ---------------------------------------------------------------------------

def test_the_childs_key_is_not_in_its_command_line(studio):
    pid = studio.loaded["pid"]
    argv = cmdline(pid)
    key = environ(pid).get("LLAMA_API_KEY")
    assert key and len(key) >= 32
    assert "--api-key" not in argv and not any(key in a for a in argv)
    assert "--api-key" not in studio.loaded["argv"]


def test_a_keyed_studio_keeps_both_keys_out_of_every_command_line(keyed, tmp_path):
    assert raw(keyed.port, "GET", "/api/status")[0] == 401
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    # With a key the caller is the user: a file-reading flag is allowed.
    code, body = keyed.call("POST", "/api/load", {"model": keyed.model, "ctx_size": 1024,
                                                  "extra_args": CPU + ["--chat-template-file", str(template)]})
    assert code == 200, body
    assert not any("studio-secret-key" in a for a in cmdline(keyed.proc.pid))
    child_argv, child_env = cmdline(body["pid"]), environ(body["pid"])
    assert not any("studio-secret-key" in a or child_env["LLAMA_API_KEY"] in a for a in child_argv)
    assert "LOCKSTEP_API_KEY" not in child_env  # the studio's key is not the child's business
    code, _ = keyed.call("GET", "/v1/models")
    assert code == 200


def test_the_engine_reads_its_key_from_a_file_or_the_environment(tiny_llama, tmp_path):
    key_file = tmp_path / "engine.key"
    key_file.write_text("file-key-123\n")
    key_file.chmod(stat.S_IRUSR | stat.S_IWUSR)
    started = [Engine(tiny_llama, "--api-key-file", str(key_file)),
               Engine(tiny_llama, env={"LLAMA_API_KEY": "env-key-456"})]
    try:
        for eng, key in zip(started, ("file-key-123", "env-key-456"), strict=True):
            eng.wait_ready()
            port = eng.port
            assert raw(port, "GET", "/v1/models")[0] == 401
            assert raw(port, "GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})[0] == 200
            assert not any(key in a for a in cmdline(eng.proc.pid))
    finally:
        for eng in started:
            eng.stop()
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    done = run_engine(["-m", str(tiny_llama), "--api-key-file", str(empty)], timeout=60)
    assert done.returncode != 0 and "--api-key-file" in done.stderr and "empty" in done.stderr


# --- hostile bodies are 4xx with one log line (the studio's side of issue 25 item 7) ---------------

@pytest.mark.parametrize(("method", "path", "body", "extra"), [
    ("POST", "/api/load", "[" * 100_000 + "]" * 100_000, {}),
    ("PUT", "/api/settings", '{"model_folders": ["abc\\ud800def"]}', {}),
    ("POST", "/api/load", '{"model": "m", "extra_args": ["\\udc80"]}', {}),
    ("POST", "/api/load", '{"model": "m"}', {"Content-Encoding": "gzip"}),
    ("POST", "/v1/chat/completions", '{"messages": []}', {"Content-Encoding": "gzip"}),
], ids=["deep-nesting", "surrogate-setting", "surrogate-arg", "gzip-load", "gzip-proxy"])
def test_hostile_bodies_are_4xx_without_a_traceback(studio, method, path, body, extra):
    before = studio.call("GET", "/api/settings")[1]["settings"]
    code, _, payload = raw(studio.port, method, path, body, {"Content-Type": "application/json", **extra})
    assert code == 400 and error_type(payload) == "invalid_request_error"
    assert studio.call("GET", "/api/settings")[1]["settings"] == before
    assert engine_pid(studio) == studio.loaded["pid"]
    assert "Traceback" not in studio.output()
