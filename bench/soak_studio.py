"""Hostile soak of the studio (issue 25): two `lockstep serve` processes on one config folder, each with
concurrent settings writers, hostile requests (foreign Host and Origin, text/plain, deep nesting, lone
surrogates, a false Content-Encoding, path traversal, an oversized body) and a /api/status latency probe.

Pass: no 5xx, every hostile request answered 4xx, each writer's last acknowledged value is the one on
disk (no write lost between the two studios), the file parses, nothing set aside, /api/status p99 <
100 ms. No engine is loaded: this is the studio's own surface.

  python bench/soak_studio.py --seconds 30 --out bench/evidence/soak-studio-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ("ctx_size", "batch_size", "ubatch_size", "spec_draft_n_max")  # one writer each, per studio
JSON = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hostile(port: int) -> list[tuple[str, str, dict, bytes | None]]:
    base = f"http://127.0.0.1:{port}"
    return [
        ("GET", base + "/api/status", {"Host": f"rebind.evil.example:{port}"}, None),
        ("PUT", base + "/api/settings", {**JSON, "Origin": "http://evil.example"}, b'{"preempt_mode": "park"}'),
        ("POST", base + "/api/load", {"Content-Type": "text/plain"}, b'{"model": "x"}'),
        ("POST", base + "/api/load", JSON, b"[" * 100_000 + b"]" * 100_000),
        ("PUT", base + "/api/settings", JSON, b'{"model_folders": ["a\\ud800b"]}'),
        ("POST", base + "/api/load", {**JSON, "Content-Encoding": "gzip"}, b'{"model": "x"}'),
        ("GET", base + "/v1/%2e%2e/props", {}, None),
        ("PUT", base + "/api/settings", JSON, b'{"api": {"host": "0.0.0.0"}}'),
    ]


OVERSIZED = b'{"model": "' + b"x" * (65 << 20) + b'"}'  # past the 64 MiB limit; sent once per studio


async def writer(session, port: int, field: str, acked: dict, codes: list, stop: float) -> None:
    value = 1
    while time.monotonic() < stop:
        async with session.put(f"http://127.0.0.1:{port}/api/settings", json={"load": {field: value}}) as r:
            codes.append(r.status)
            if r.status == 200:
                acked[(port, field)] = value
        value += 1


async def attacker(session, port: int, codes: list, stop: float) -> None:
    cases = hostile(port)
    try:
        async with session.post(f"http://127.0.0.1:{port}/api/load", headers=JSON, data=OVERSIZED) as r:
            codes.append(r.status)
    except aiohttp.ClientError:  # the studio may close the connection on a refused body
        codes.append(0)
    while time.monotonic() < stop:
        for method, url, headers, body in cases:
            async with session.request(method, URL(url, encoded=True), headers=headers, data=body) as r:
                await r.read()
                codes.append(r.status)


async def probe(session, port: int, latencies: list, stop: float) -> None:
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        async with session.get(f"http://127.0.0.1:{port}/api/status") as r:
            await r.read()
            assert r.status == 200
        latencies.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.05)


async def run(ports: list[int], seconds: float) -> dict:
    acked: dict = {}
    writes: list[int] = []
    attacks: list[int] = []
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        # Each field has one writer in all, alternating studios, so the final value is well defined.
        tasks = [writer(session, ports[i % 2], f, acked, writes, stop) for i, f in enumerate(FIELDS)]
        tasks += [attacker(session, p, attacks, stop) for p in ports]
        tasks += [probe(session, p, latencies, stop) for p in ports]
        await asyncio.gather(*tasks)
    return {"acked": acked, "writes": writes, "attacks": attacks, "latencies": sorted(latencies)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="soak-studio-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(PYTHONPATH=str(ROOT), LOCKSTEP_CONFIG_DIR=str(work / "config"), LOCKSTEP_LOG_DIR=str(work / "logs"))
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, "-m", "studio", "serve", "--port", str(p)], cwd=ROOT, env=env,
                              stderr=open(work / f"studio-{p}.log", "w")) for p in ports]
    try:
        deadline = time.monotonic() + 60
        for p in ports:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", p), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"studio on {p} did not start") from None
                    time.sleep(0.05)
        result = asyncio.run(run(ports, args.seconds))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    on_disk = json.loads((work / "config" / "settings.json").read_text())["load"]
    lost = {f: (v, on_disk.get(f)) for (_, f), v in result["acked"].items() if on_disk.get(f) != v}
    lat = result["latencies"]
    logs = "".join((work / f"studio-{p}.log").read_text() for p in ports)
    report = {
        "seconds": args.seconds,
        "settings_writes": len(result["writes"]),
        "settings_write_codes": sorted(set(result["writes"])),
        "hostile_requests": len(result["attacks"]),
        "hostile_codes": {str(c): result["attacks"].count(c) for c in sorted(set(result["attacks"]))},
        "five_xx": sum(1 for c in result["writes"] + result["attacks"] if c >= 500),
        "writes_lost": lost,
        "set_aside_files": sorted(p.name for p in (work / "config").glob("settings.json.corrupt-*")),
        "tracebacks_logged": logs.count("Traceback"),
        "status_probes": len(lat),
        "status_p50_ms": round(lat[len(lat) // 2], 2),
        "status_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
        "load_average_1m": round(os.getloadavg()[0], 2),  # the machine is shared: latency follows its load
        "cpus": os.cpu_count(),
    }
    report["pass"] = (report["five_xx"] == 0 and not lost and not report["set_aside_files"]
                      and report["tracebacks_logged"] == 0 and all(400 <= c < 500 for c in result["attacks"] if c)
                      and report["status_p99_ms"] < 100)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
