"""Decode and prefill throughput of the real engine: solo and concurrent chats, exact on and off.

    python bench/throughput.py --shape 1b --device cuda      # on a GPU machine
    python bench/throughput.py --shape tiny --device cpu --cells 1,2 --gen 16   # plumbing check
    python bench/throughput.py --shape 8b --quant q4_k_m --device cuda   # the Q4_K_M-like file
    python bench/throughput.py -m assets/models/lockstep-pycode-13m --vocab 8192 --device cpu --cells 1,4 \
        --prompt 128 --threads 1   # the bundled model on the CPU backend
    (speculation has its own benchmark: bench/speculation.py)

Each cell sends C streamed /completion requests at once (random 512-token prompts, greedy, no prompt
cache) to an engine started here; exact on and off run as two engines side by side and the cells
alternate between them, so drift in the machine hits both alike. Aggregate decode tok/s is the sum
of the requests' own decode rates (tokens after the first over the time since the first); medians of
--repeats runs. Writes JSON and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from shapes import QUANTS, SHAPES, kv_bytes_per_token, weight_bytes, write_shape  # noqa: E402

from studio.evidence import EngineServer  # noqa: E402
from tests.engine_helpers import sse_events  # noqa: E402

COPY_BANDWIDTH = 4.28e12  # bytes/s, measured on the H200 (DESIGN.md)


async def one_request(session, url: str, prompt: list[int], n_predict: int, cached: bool = False) -> dict:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": cached, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    final = None
    async with session.post(url + "/completion", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        async for data in sse_events(r):
            if ttft is None and data.get("tokens"):
                ttft = time.perf_counter() - t0
            if data.get("stop"):
                final = data
    t = final["timings"]
    return {"ttft_s": ttft, "decode_tps": t["predicted_per_second"], "prefill_tps": t["prompt_per_second"],
            "generated": t["predicted_n"], "prompt_n": t["prompt_n"], "wall_s": time.perf_counter() - t0}


async def engine_counters(session, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return {k.split(":", 1)[1]: float(v) for k, v in (ln.split() for ln in text.splitlines()
                                                      if ln.startswith("lockstep:"))}


async def cell(session, url: str, prompts: list[list[int]], n_predict: int, cached: bool = False) -> dict:
    """C chats at once. `cached`: the prompts are evaluated and cached first, so the chats decode
    without other chats' prompts being processed in between (decode alone, as llama-batched-bench
    separates prompt processing from generation)."""
    if cached:
        await asyncio.gather(*(one_request(session, url, p, 0, cached=True) for p in prompts))
    before = await engine_counters(session, url)
    results = await asyncio.gather(*(one_request(session, url, p, n_predict, cached) for p in prompts))
    after = await engine_counters(session, url)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0)
         for k in ("steps_total", "step_seconds_total", "busy_seconds_total", "decode_steps_total",
                   "decode_step_seconds_total", "ahead_steps_total")}
    steps = max(d["steps_total"], 1.0)
    return {"decode_tps": sum(r["decode_tps"] for r in results),
            "ttft_s": statistics.median(r["ttft_s"] for r in results),
            "prefill_tps": statistics.median(r["prefill_tps"] for r in results),
            "generated": sum(r["generated"] for r in results),
            "prompt_evaluated": sum(r["prompt_n"] for r in results),
            # where the compute thread's time went: forward steps (device work and the wait for it)
            # against scheduling, sampling and event dispatch around them (which overlap the device
            # work of the steps launched ahead)
            "decode_step_ms": d["decode_step_seconds_total"] / max(d["decode_steps_total"], 1.0) * 1000,
            "host_ms_per_step": (d["busy_seconds_total"] - d["step_seconds_total"]) / steps * 1000,
            "ahead_fraction": round(d["ahead_steps_total"] / steps, 3)}


def gpu_memory_mib(pids: set[int]) -> int | None:
    try:
        rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [int(m) for p, m in (r.split(",") for r in rows.strip().splitlines() if "," in r) if int(p) in pids]
    return max(used) if used else None


def prompts_for(n: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(vocab - 2) for _ in range(length)] for _ in range(n)]


async def run(args) -> dict:
    model = args.model
    tmp = tempfile.TemporaryDirectory()
    if not model:
        t = time.perf_counter()
        model = str(write_shape(Path(tmp.name) / f"{args.shape}-{args.quant}.gguf", args.shape, args.seed, args.quant))
        print(f"wrote the {args.shape} {args.quant} shape in {time.perf_counter() - t:.1f} s", flush=True)
    cells = [int(c) for c in args.cells.split(",")]
    ctx = max(cells) * (args.prompt + args.gen + 256)
    base = ["--parallel", str(max(cells)), "--ctx-size", str(ctx), "--kv-unified", "--device", args.device,
            "--metrics", *(["--threads", str(args.threads)] if args.threads else []),
            *shlex.split(args.engine_args)]
    servers = {m: EngineServer(model, [*base, "--exact-concurrency", m]) for m in args.modes.split(",")}
    rng = random.Random(args.seed)
    vocab = SHAPES[args.shape]["vocab"] if not args.model else args.vocab
    raw: dict = {m: {c: [] for c in cells} for m in servers}
    peak: dict = {}
    n_threads: dict = {}  # what each engine's /props says it computes with (-t, or its default)
    timeout = aiohttp.ClientTimeout(total=1800)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for s in servers.values():
                await s.start(session, timeout=900)
            print("servers ready", flush=True)
            for m, s in servers.items():
                async with session.get(s.url + "/props") as resp:
                    n_threads[m] = (await resp.json()).get("n_threads")
            for s in servers.values():  # warm-up: kernels compiled, graphs captured for every bucket
                for c in cells:
                    await cell(session, s.url, prompts_for(c, args.prompt, vocab, rng), 8)
            for rep in range(args.repeats):
                for c in cells:
                    for m in raw:
                        prompts = prompts_for(c, args.prompt, vocab, rng)
                        got = await cell(session, servers[m].url, prompts, args.gen)
                        warm = await cell(session, servers[m].url, prompts, args.gen, cached=True)
                        got |= {"decode_tps_cached": warm["decode_tps"], "decode_step_ms": warm["decode_step_ms"],
                                "cached_prompt_evaluated": warm["prompt_evaluated"],
                                "host_ms_per_step": warm["host_ms_per_step"], "ahead_fraction": warm["ahead_fraction"]}
                        raw[m][c].append(got)
                        print(f"rep {rep} cell {c:>2} exact {m:<3} decode {got['decode_tps']:8.1f} tok/s  "
                              f"cached prompts {warm['decode_tps']:8.1f} tok/s  ttft {got['ttft_s'] * 1000:7.1f} ms  "
                              f"prefill {got['prefill_tps']:8.1f} tok/s", flush=True)
            peak = {m: gpu_memory_mib({s.proc.pid}) for m, s in servers.items()}
    finally:
        await asyncio.gather(*(s.stop() for s in servers.values()), return_exceptions=True)
        tmp.cleanup()
    return summarize(args, raw, peak, [{**s.describe(), "n_threads": n_threads.get(m)} for m, s in servers.items()])


def _med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def summarize(args, raw, peak, servers) -> dict:
    wbytes = weight_bytes(args.shape, args.quant)
    kvt = kv_bytes_per_token(args.shape)
    table = []
    for c in next(iter(raw.values())):
        row = {"chats": c}
        for m in raw:
            tps = _med(raw[m][c], "decode_tps_cached")  # decode alone: what the bandwidth figure is about
            step_bytes = wbytes + c * (args.prompt + args.gen / 2) * kvt
            row[m] = {"decode_tps": round(_med(raw[m][c], "decode_tps"), 1), "decode_tps_cached": round(tps, 1),
                      "ttft_ms": round(_med(raw[m][c], "ttft_s") * 1000, 1),
                      "prefill_tps": round(_med(raw[m][c], "prefill_tps"), 1),
                      "bandwidth_fraction": round(step_bytes * tps / c / COPY_BANDWIDTH, 3),
                      "decode_step_ms": round(_med(raw[m][c], "decode_step_ms"), 3),
                      "host_ms_per_step": round(_med(raw[m][c], "host_ms_per_step"), 3),
                      # decode steps of the cached cells launched before the previous step's tokens were read
                      "ahead_fraction": _med(raw[m][c], "ahead_fraction"),
                      "runs": [round(r["decode_tps"], 1) for r in raw[m][c]],
                      "runs_cached": [round(r["decode_tps_cached"], 1) for r in raw[m][c]],
                      # prompt tokens the cached cells still evaluated (one per chat when the cache hit)
                      "cached_prompt_evaluated": [r["cached_prompt_evaluated"] for r in raw[m][c]]}
        if "on" in row and "off" in row:
            row["on_over_off_decode"] = round(row["on"]["decode_tps"] / row["off"]["decode_tps"], 3)
            row["on_over_off_decode_cached"] = round(row["on"]["decode_tps_cached"] / row["off"]["decode_tps_cached"], 3)
            row["on_over_off_prefill"] = round(row["on"]["prefill_tps"] / row["off"]["prefill_tps"], 3)
        table.append(row)
    out = {"shape": args.shape, "model": args.model, "threads": args.threads or None, "quant": args.quant,
           "device": args.device, "prompt": args.prompt, "generated": args.gen,
           "repeats": args.repeats, "weight_bytes": wbytes, "peak_gpu_mib": peak, "cells": table,
           "servers": servers}
    return out


def markdown(r: dict) -> str:
    what = f"{Path(r['model']).name}" if r.get("model") else f"{r['shape']} shape ({r.get('quant', 'f16')})"
    used = sorted({s.get("n_threads") for s in r.get("servers", []) if s.get("n_threads")})
    threads = f", -t {r['threads']}" if r.get("threads") else f", {'/'.join(map(str, used))} threads (default)" if used else ""
    lines = [f"# Throughput: {what} on {r['device']}{threads} ({r['prompt']}-token prompts, "
             f"{r['generated']} generated, median of {r['repeats']})", "",
             "Decode tok/s: the sum of the chats' own rates, other chats' prompts processed in between; "
             "'cached': the same prompts cached first, so the chats only decode.", "",
             "| chats | exact on tok/s | exact off tok/s | on/off | cached on | cached off | on/off | TTFT on ms "
             "| TTFT off ms | prefill on tok/s | prefill off tok/s | on/off | BW on (cached) "
             "| decode step on ms | host on ms/step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["cells"]:
        on, off = row.get("on", {}), row.get("off", {})
        lines.append(f"| {row['chats']} | {on.get('decode_tps')} | {off.get('decode_tps')} | "
                     f"{row.get('on_over_off_decode')} | {on.get('decode_tps_cached')} | {off.get('decode_tps_cached')} | "
                     f"{row.get('on_over_off_decode_cached')} | {on.get('ttft_ms')} | {off.get('ttft_ms')} | "
                     f"{on.get('prefill_tps')} | {off.get('prefill_tps')} | {row.get('on_over_off_prefill')} | "
                     f"{on.get('bandwidth_fraction')} | {on.get('decode_step_ms')} | {on.get('host_ms_per_step')} |")
    lines += ["", f"Peak GPU memory (MiB): {json.dumps(r['peak_gpu_mib'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--quant", default="f16", choices=QUANTS, help="weights of the generated shape")
    ap.add_argument("-m", "--model", help="an existing model instead of a generated shape (give --vocab)")
    ap.add_argument("--vocab", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cells", default="1,4,8,16")
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="the engines' -t (default: theirs)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "evidence" / "throughput"))
    ap.add_argument("--engine-args", default="", help="more engine flags for both servers, e.g. '--tp 2'")
    args = ap.parse_args(argv)
    write_report(args.out, asyncio.run(run(args)), markdown)
    return 0


def write_report(out: str, result: dict, markdown) -> None:
    """`out`.json and `out`.md (the markdown also printed)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    sys.exit(main())
