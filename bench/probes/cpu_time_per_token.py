"""CPU ms per generated token of a real engine child on the bundled model: (utime + stime) over greedy
requests with cached prompts, solo and 4 chats; less sensitive to a shared machine than wall tok/s.

    python bench/probes/cpu_time_per_token.py TREE THREADS on|off
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request


def main(tree: str, threads: str, exact: str) -> None:
    port = 18000 + random.randint(0, 999)
    child = subprocess.Popen(
        [sys.executable, "-m", "engine", "-m", "assets/models/lockstep-pycode-13m", "--port", str(port),
         "--parallel", "4", "--ctx-size", "2048", "--kv-unified", "--device", "cpu", "--threads", threads,
         "--exact-concurrency", exact],
        cwd=tree, env=dict(os.environ, PYTHONPATH=tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    def cpu_seconds() -> float:
        with open(f"/proc/{child.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise SystemExit("the engine did not come up") from None
                time.sleep(0.3)
        rng = random.Random(0)
        prompts = [[rng.randrange(8192) for _ in range(128)] for _ in range(4)]
        for chats in (1, 4):
            for p in prompts[:chats]:
                post({"prompt": p, "n_predict": 1, "cache_prompt": True, "temperature": 0})
            rows = []
            for _ in range(3):
                c0, t0 = cpu_seconds(), time.perf_counter()
                out: list = [None] * chats

                def run(i: int, out: list = out) -> None:
                    out[i] = post({"prompt": prompts[i], "n_predict": 128, "cache_prompt": True, "temperature": 0,
                                   "ignore_eos": True})

                workers = [threading.Thread(target=run, args=(i,)) for i in range(chats)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                n = sum(o["tokens_predicted"] for o in out)
                rows.append(((cpu_seconds() - c0) / n * 1e3, n / (time.perf_counter() - t0)))
            print(f"{os.path.basename(tree)} t{threads} exact {exact} chats {chats}: cpu ms/token "
                  f"{' '.join(f'{a:.2f}' for a, _ in rows)}  wall tok/s {' '.join(f'{b:.0f}' for _, b in rows)}")
    finally:
        child.terminate()
        child.wait()


if __name__ == "__main__":
    main(*sys.argv[1:4])
