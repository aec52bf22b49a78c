"""A scripted stand-in for the engine process, shared by the launcher, manager and API tests.

The real CPU engine cannot be made to run out of memory or lack CUDA on
demand; this stand-in speaks the engine's command line, its one-line failure messages and exit
codes, /health, /props, /slots, /metrics and a streaming /v1/chat/completions, and records each
launch (argv and the environment variables the studio manages) so tests can check what was spawned.
The real engine is exercised in test_studio_integration.py.
"""

import json
import sys
import textwrap

import numpy as np
import pytest

STANDIN = textwrap.dedent('''
    import argparse, json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    p = argparse.ArgumentParser()
    p.add_argument("--model"); p.add_argument("--alias"); p.add_argument("--host"); p.add_argument("--port", type=int)
    p.add_argument("--parallel", type=int); p.add_argument("--api-key"); p.add_argument("--ctx-size", type=int, default=0)
    p.add_argument("--flash-attn", default="auto"); p.add_argument("--device", default="auto")
    p.add_argument("--cache-type-k", default="f16"); p.add_argument("--cache-type-v", default="f16")
    p.add_argument("--exact-concurrency", default="off"); p.add_argument("--kv-unified", action="store_true")
    args, rest = p.parse_known_args()
    env = os.environ
    args.api_key = args.api_key or env.get("LLAMA_API_KEY")  # the studio passes it by environment
    state = env["STANDIN_DIR"]
    with open(os.path.join(state, "calls.jsonl"), "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(), "LOCKSTEP_EXACT": env.get("LOCKSTEP_EXACT"),
                            "LOCKSTEP_PREEMPT_MODE": env.get("LOCKSTEP_PREEMPT_MODE")}) + "\\n")
    print("standin engine starting", flush=True)
    exact = args.exact_concurrency == "on"
    if exact != (env.get("LOCKSTEP_EXACT") == "1"):
        print("error: argv and LOCKSTEP_EXACT disagree", file=sys.stderr); sys.exit(1)
    def die(line, code):
        print(line, file=sys.stderr, flush=True); sys.exit(code)
    if "broken" in args.model:
        die("error: model load failed: unsupported architecture 'broken'", 4)
    if env.get("STANDIN_NO_CUDA") and args.device != "cpu":
        die("error: no usable CUDA device: no NVIDIA driver found", 6)
    if exact and args.cache_type_k not in ("f16", "bf16", "f32"):
        die(f"exact concurrency: KV cache type {args.cache_type_k} is not supported; use -ctk f16 (or bf16)", 3)
    if exact and args.flash_attn == "off":
        die("exact concurrency: flash attention off is not supported; use -fa on", 3)
    ctx = args.ctx_size or int(env.get("STANDIN_NATIVE_CTX", "0"))
    if ctx > int(env.get("STANDIN_MAX_CTX", "1000000")):
        die(f"error: out of memory: needs {ctx} cells, {env['STANDIN_MAX_CTX']} fit", 5)
    if env.get("STANDIN_CRASH"):
        raise RuntimeError("stand-in crash")
    if env.get("STANDIN_EXIT0"):
        sys.exit(0)

    props = {"n_ctx": args.ctx_size, "total_slots": args.parallel, "model_path": args.model,
             "exact_concurrency": {"requested": exact, "granted": exact, "reason": None, "page_size": 256,
                                   "backend": "cpu"}}
    if env.get("STANDIN_DENY"):
        props["exact_concurrency"].update(granted=False, reason=env["STANDIN_DENY"])
    if env.get("STANDIN_NO_EXACT_FIELD"):
        del props["exact_concurrency"]
    health_polls = [int(env.get("STANDIN_LOADING_POLLS", "0"))]

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def send_json(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
        def authorized(self):
            if self.headers.get("Authorization") != f"Bearer {args.api_key}":
                self.send_json(401, {"error": {"code": 401, "type": "authentication_error", "message": "key"}})
                return False
            return True
        def do_GET(self):
            if not self.authorized():
                return
            if env.get("STANDIN_HANG"):
                return self.send_json(503, {"error": {"code": 503, "type": "unavailable", "message": "loading"}})
            if self.path == "/health":
                if health_polls[0] > 0:
                    health_polls[0] -= 1
                    return self.send_json(503, {"error": {"code": 503, "type": "unavailable", "message": "loading"}})
                return self.send_json(200, {"status": "ok"})
            if self.path == "/props":
                return self.send_json(200, props)
            if self.path == "/slots":
                return self.send_json(200, [{"id": i, "is_processing": False} for i in range(args.parallel)])
            if self.path == "/metrics":
                data = b"# HELP x\\nlockstep:pages_used 3\\nlockstep:pages_free 61\\nlockstep:parks_total 2\\n"
                self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
                return self.wfile.write(data)
            if self.path == "/v1/models":
                return self.send_json(200, {"object": "list", "data": [{"id": args.alias, "object": "model"}]})
            self.send_json(404, {"error": {"code": 404, "type": "not_found", "message": self.path}})
        def do_POST(self):
            if not self.authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            with open(os.path.join(state, "requests.jsonl"), "a") as f:
                f.write(json.dumps({"path": self.path, "body": body}) + "\\n")
            if self.path != "/v1/chat/completions":
                return self.send_json(404, {"error": {"code": 404, "type": "not_found", "message": self.path}})
            words = ["Hello", " from", " the", " stand-in"]
            if not body.get("stream"):
                return self.send_json(200, {"id": "c", "object": "chat.completion", "created": 0, "model": args.alias,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "".join(words)}}]})
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            gate = body.get("gate")  # the test creates this file once it has the first chunk
            for i, w in enumerate(words):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": args.alias,
                         "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\\n\\n".encode()); self.wfile.flush()
                if i == 0 and gate:
                    deadline = time.monotonic() + 30
                    while not os.path.exists(gate) and time.monotonic() < deadline:
                        time.sleep(0.01)
            self.wfile.write(b"data: [DONE]\\n\\n"); self.wfile.flush()

    try:
        server = ThreadingHTTPServer((args.host, args.port), H)
    except OSError as exc:
        die(f"error: cannot bind {args.host}:{args.port}: {exc}", 8)
    print(f"standin listening on {args.port}", flush=True)
    server.serve_forever()
''')


@pytest.fixture(name="standin")
def standin_fixture(tmp_path):
    script = tmp_path / "standin_engine.py"
    script.write_text(STANDIN)
    state = tmp_path / "state"
    state.mkdir()

    class Standin:
        cmd = (sys.executable, str(script))
        dir = state

        def env(self, **extra):
            base = {"PATH": "/usr/bin:/bin", "STANDIN_DIR": str(state)}
            base.update({k: str(v) for k, v in extra.items()})
            return base

        def requests(self):
            path = state / "requests.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

        def calls(self):
            path = state / "calls.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return Standin()


def write_gguf(path, arch="llama", context=2048, types=("F32", "F16")):
    """A tiny valid GGUF file; returns its parameter count."""
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_context_length(context)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    shapes = {"token_embd.weight": (32, 8), "blk.0.attn_q.weight": (8, 8), "output_norm.weight": (8,)}
    dtypes = {"F32": np.float32, "F16": np.float16}
    for i, (name, shape) in enumerate(shapes.items()):
        kind = types[i % len(types)]
        writer.add_tensor(name, np.ones(shape, dtype=dtypes[kind]), raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sum(int(np.prod(s)) for s in shapes.values())


def test_standin_refuses_a_wrong_api_key(tmp_path):
    """The stand-in checks the key the studio gives the child, so proxy tests prove it is passed on."""
    import subprocess
    import time
    import urllib.error
    import urllib.request

    from studio.engine_child import free_port

    script = tmp_path / "s.py"
    script.write_text(STANDIN)
    port = free_port()
    env = {"STANDIN_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, str(script), "--model", "/m", "--alias", "m", "--host", "127.0.0.1",
                             "--port", str(port), "--parallel", "1", "--api-key", "right"], env=env)
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline and status is None:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/health", headers={"Authorization": "Bearer wrong"})
            try:
                urllib.request.urlopen(req, timeout=1)
                status = 200
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:
                time.sleep(0.05)  # not listening yet: a poll interval, bounded by the deadline
        assert status == 401
    finally:
        proc.kill()
        proc.wait()
