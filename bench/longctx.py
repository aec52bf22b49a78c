"""Long prompts and long contexts through the real engine (issue 32): exact on and off interleaved.

    python bench/longctx.py --shape 8b --device cuda --out bench/evidence/longctx-h200   # on a GPU machine

Two engines side by side (-c 32768, -np 4, -kvu). First the first 4-chat request on each fresh engine
against a later one (the load warms every kernel up, so the ratio should be ~1); then solo requests of
each --prompts length (prefill tok/s, and decode tok/s after that prompt), the modes alternating cell by
cell. Beside each figure its bound: prefill by compute (weight and attention FLOPs at --peak-tflops),
decode by bandwidth (weights and the context's KV each token, at the copy bandwidth).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from shapes import SHAPES, kv_bytes_per_token, weight_bytes, write_shape  # noqa: E402
from throughput import COPY_BANDWIDTH, cell, one_request, prompts_for, write_report  # noqa: E402

from studio.evidence import EngineServer  # noqa: E402


def prefill_bound(shape: str, prompt: int, peak_flops: float) -> float:
    """Tokens/s if every weight and attention FLOP of the prompt ran at the peak (causal attention:
    on average prompt / 2 keys a row, score and value products)."""
    s = SHAPES[shape]
    attn = 4 * s["layers"] * s["heads"] * s["head_dim"] * (prompt / 2)
    return peak_flops / (weight_bytes(shape) + attn)  # f16 weights: 2 FLOPs per 2-byte weight


def decode_bound(shape: str, context: int) -> float:
    return COPY_BANDWIDTH / (weight_bytes(shape) + context * kv_bytes_per_token(shape))


async def run(args) -> dict:
    model = args.model
    if not model:
        model = str(write_shape(Path(args.tmp) / f"{args.shape}.gguf", args.shape, args.seed))
    vocab = SHAPES[args.shape]["vocab"]
    base = ["--parallel", "4", "--ctx-size", str(args.ctx), "--kv-unified", "--device", args.device, "--metrics"]
    servers = {m: EngineServer(model, [*base, "--exact-concurrency", m]) for m in args.modes.split(",")}
    variants = dict(v.split(":", 1) for v in args.env_variant)  # label -> NAME=VALUE[,NAME=VALUE...]
    for label, assigns in variants.items():
        env = dict(a.split("=", 1) for a in assigns.split(","))
        for m in args.modes.split(","):
            servers[f"{m}+{label}"] = EngineServer(model, [*base, "--exact-concurrency", m], env)
    flagged = dict(v.split(":", 1) for v in args.arg_variant)  # label -> engine flags
    for label, flags in flagged.items():
        for m in args.modes.split(","):
            servers[f"{m}+{label}"] = EngineServer(model, [*base, "--exact-concurrency", m, *flags.split()])
    variants.update(flagged)
    rng = random.Random(args.seed)
    out: dict = {"shape": args.shape, "ctx": args.ctx, "gen": args.gen, "repeats": args.repeats,
                 "peak_tflops": args.peak_tflops, "copy_bandwidth": COPY_BANDWIDTH, "first_request": {},
                 "load_seconds": {}, "cells": []}
    timeout = aiohttp.ClientTimeout(total=1800)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            t0 = time.perf_counter()
            await asyncio.gather(*(s.start(session, timeout=900) for s in servers.values()))
            print(f"servers ready in {time.perf_counter() - t0:.1f} s", flush=True)
            for m, s in servers.items():
                async with session.get(s.url + "/props") as r:
                    out["load_seconds"][m] = (await r.json()).get("load_seconds")
                first = await cell(session, s.url, prompts_for(4, 512, vocab, rng), args.gen)
                later = await cell(session, s.url, prompts_for(4, 512, vocab, rng), args.gen)
                out["first_request"][m] = {"first_decode_tps": round(first["decode_tps"], 1),
                                           "later_decode_tps": round(later["decode_tps"], 1),
                                           "ratio": round(first["decode_tps"] / later["decode_tps"], 3),
                                           "first_prefill_tps": round(first["prefill_tps"], 1),
                                           "later_prefill_tps": round(later["prefill_tps"], 1)}
                print(m, "first request", out["first_request"][m], flush=True)
            for length in [int(x) for x in args.prompts.split(",")]:
                runs: dict = {m: [] for m in servers}
                for _ in range(args.repeats):
                    for m, s in servers.items():
                        got = await one_request(session, s.url, prompts_for(1, length, vocab, rng)[0], args.gen)
                        runs[m].append(got)
                        print(f"prompt {length:>6} exact {m:<3} prefill {got['prefill_tps']:9.1f} tok/s  decode "
                              f"{got['decode_tps']:7.1f} tok/s", flush=True)
                row: dict = {"prompt": length,
                             "prefill_bound_tps": round(prefill_bound(args.shape, length, args.peak_tflops * 1e12)),
                             "decode_bound_tps": round(decode_bound(args.shape, length + args.gen // 2), 1)}
                for m, rs in runs.items():
                    pre = statistics.median(r["prefill_tps"] for r in rs)
                    dec = statistics.median(r["decode_tps"] for r in rs)
                    row[m] = {"prefill_tps": round(pre, 1), "decode_tps": round(dec, 1),
                              "prefill_of_bound": round(pre / row["prefill_bound_tps"], 3),
                              "decode_of_bound": round(dec / row["decode_bound_tps"], 3),
                              "runs_prefill": [round(r["prefill_tps"], 1) for r in rs],
                              "runs_decode": [round(r["decode_tps"], 1) for r in rs]}
                for label in variants:
                    for m in args.modes.split(","):
                        if m in row and f"{m}+{label}" in row:
                            v, b = row[f"{m}+{label}"], row[m]
                            row[f"{m}+{label}_over_{m}"] = {k: round(v[k] / b[k], 3) for k in ("prefill_tps", "decode_tps")}
                if "on" in row and "off" in row:
                    row["on_over_off_prefill"] = round(row["on"]["prefill_tps"] / row["off"]["prefill_tps"], 3)
                    row["on_over_off_decode"] = round(row["on"]["decode_tps"] / row["off"]["decode_tps"], 3)
                out["cells"].append(row)
                if args.out:  # each length's cells as it ends: a run cut short keeps what it measured
                    Path(args.out).with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        await asyncio.gather(*(s.stop() for s in servers.values()), return_exceptions=True)
    return out


def markdown(r: dict) -> str:
    lines = [f"# Long prompts: {r['shape']} shape (f16), -c {r['ctx']}, solo, {r['gen']} generated, median of "
             f"{r['repeats']}", "",
             "Bounds: prefill by compute (weights and causal attention at "
             f"{r['peak_tflops']} TFLOP/s), decode by bandwidth (weights and the context's KV at "
             f"{r['copy_bandwidth'] / 1e12:.2f} TB/s).", "",
             "| prompt | prefill on | prefill off | on/off | bound (compute) | decode on | decode off | on/off "
             "| bound (bandwidth) |", "|---|---|---|---|---|---|---|---|---|"]
    for c in r["cells"]:
        on, off = c.get("on", {}), c.get("off", {})
        lines.append(f"| {c['prompt']} | {on.get('prefill_tps')} | {off.get('prefill_tps')} | "
                     f"{c.get('on_over_off_prefill')} | {c['prefill_bound_tps']} | {on.get('decode_tps')} | "
                     f"{off.get('decode_tps')} | {c.get('on_over_off_decode')} | {c['decode_bound_tps']} |")
    extra = [k for c in r["cells"] for k in c if "+" in k and "_over_" not in k]
    if extra:
        lines += ["", "| prompt | engine | prefill | decode | prefill / without | decode / without |",
                  "|---|---|---|---|---|---|"]
        for c in r["cells"]:
            for k in dict.fromkeys(extra):
                ratio = c.get(f"{k}_over_{k.split('+')[0]}", {})
                lines.append(f"| {c['prompt']} | {k} | {c[k]['prefill_tps']} | {c[k]['decode_tps']} | "
                             f"{ratio.get('prefill_tps')} | {ratio.get('decode_tps')} |")
    lines += ["", "First 4-chat request (512-token prompts) on a fresh engine against a later one: "
              + json.dumps(r["first_request"]), "", "Load seconds: " + json.dumps(r["load_seconds"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("-m", "--model", help="an existing file of --shape instead of writing one")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--prompts", default="512,2048,8192,30000")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="dense 16-bit matrix peak (H200: ~790)")
    ap.add_argument("--env-variant", action="append", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
                    help="beside each mode's engine one with these NAME=VALUE in its environment (mode+LABEL), cells interleaved")
    ap.add_argument("--arg-variant", action="append", default=[], metavar="LABEL:FLAGS",
                    help="beside each mode's engine one started with these extra flags, e.g. 'ub2048:-ub 2048' (mode+LABEL)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--out", default=str(ROOT / "bench" / "evidence" / "longctx"))
    args = ap.parse_args(argv)
    write_report(args.out, asyncio.run(run(args)), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
