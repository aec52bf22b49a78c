"""Decode and prefill speed of the "4B hybrid" shape (Qwen3.5-4B's text config, F16 weights from a
seed) through the engine's Runner on CUDA, in one process: no GGUF file, no server.

    python bench/hybrid_decode.py --out /tmp/hybrid-4b.json [--chats 1,16] [--modes on,off]

Each cell prefills `chats` prompts of --prompt tokens (one prompt per step, the engine's -ub 512
steps), then times --gen greedy decode steps of all of them (decode graphs replayed). Random
weights do not change speed. Bound: the weights' bytes read once per step at the measured copy
bandwidth (DESIGN.md: 4.28 TB/s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kv_cache import pages_for  # noqa: E402
from engine.loader import LoadedModel  # noqa: E402
from engine.models.qwen3_5 import expected_shapes, from_hf_config  # noqa: E402
from engine.runner import Runner, StepEntry  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes_hybrid import hf_config  # noqa: E402

COPY_BANDWIDTH = 4.28e12


def random_model(shape: str = "4b-hybrid", seed: int = 0) -> LoadedModel:
    config = from_hf_config(hf_config(shape))
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    # one block of random rows, repeated into every matrix (drawing 4B normals would take minutes)
    block = (rng.standard_normal((1024, max(s[-1] for s in shapes.values())), dtype=np.float32) * 0.02).astype(
        np.float16)
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 2:
            weights[name] = Weight(np.resize(block[: min(shape[0], 1024), : shape[1]], shape), "f16")
        elif name.endswith("A_log"):
            weights[name] = Weight(np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32), "f32")
        elif name.endswith("conv1d.weight"):
            weights[name] = Weight((rng.standard_normal(shape) * 0.3).astype(np.float32), "f32")
        elif name.endswith("linear_attn.norm.weight"):
            weights[name] = Weight(np.ones(shape, np.float32), "f32")
        else:  # the (1 + w) norms and dt_bias
            weights[name] = Weight(np.zeros(shape, np.float32), "f32")
    return LoadedModel(Path("4b-hybrid"), "hf", config, weights, None)


def weight_bytes(loaded: LoadedModel) -> int:
    """Bytes a decode step reads: every matrix once (the tied embedding as lm_head)."""
    return sum(w.data.nbytes for w in loaded.weights.values() if w.data.ndim == 2)


def run_cell(runner: Runner, chats: int, prompt: int, gen: int, rng, sync=lambda: None) -> dict:
    vocab = runner.config.vocab_size
    seqs = []
    t0 = time.perf_counter()
    for _ in range(chats):
        pages = runner.pool.alloc(pages_for(prompt + 2 * gen + 8))  # timed plainly, then ahead
        state = runner.new_state()
        out = runner.step([StepEntry(pages, [int(t) for t in rng.integers(0, vocab, prompt)], 0, "last",
                                     full_rows=False, state=state, prompt=True)])
        seqs.append([pages, state, int(out[0].argmax[-1]), prompt])
    prefill_s = time.perf_counter() - t0

    def step():
        out = runner.step([StepEntry(p, [tok], pos, "last", full_rows=False, state=st) for p, st, tok, pos in seqs])
        for s, o in zip(seqs, out, strict=True):
            s[2], s[3] = int(o.argmax[-1]), s[3] + 1

    for _ in range(3):  # the bucket's graph captured
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(gen):
        step()
    decode_s = time.perf_counter() - t0

    def ahead(pending):
        """The scheduler's steady decode: the next step launched before this one's tokens are read."""
        nxt = runner.launch_ahead(pending, [StepEntry(p, [0], pos + 1, "last", full_rows=False, state=st)
                                            for p, st, _, pos in seqs])
        for s, o in zip(seqs, pending.collect(), strict=True):
            s[2], s[3] = int(o.argmax[-1]), s[3] + 1
        return nxt

    pending = runner.launch([StepEntry(p, [tok], pos, "last", full_rows=False, state=st) for p, st, tok, pos in seqs])
    pending = ahead(pending)  # the ahead path's first replay
    sync()
    t0 = time.perf_counter()
    for _ in range(gen):
        pending = ahead(pending)
    ahead_s = time.perf_counter() - t0
    pending.collect()
    cell = {"chats": chats, "prefill_tps": round(chats * prompt / prefill_s, 1),
            "decode_tps": round(chats * gen / decode_s, 1), "decode_step_ms": round(1000 * decode_s / gen, 3),
            "decode_ahead_tps": round(chats * gen / ahead_s, 1), "decode_ahead_step_ms": round(1000 * ahead_s / gen, 3)}
    if runner.graphs is not None and runner.graphs._graphs:
        from hybrid_profile import graph_replay_ms

        cell["graph_replay_ms"] = round(graph_replay_ms(runner, max(runner.graphs._graphs)), 4)
    for p, *_ in seqs:
        runner.pool.release(p)
    return cell


def use_matvec_table(path: Path | None, defaults: dict = {}) -> None:  # noqa: B006 (the plan's own, kept once)
    """Plans matvec.cu's launches with a table bench/probes/matvec_pick.py wrote (A/B cells), or
    (None) with the plan's own."""
    from lockstep_kernels.cuda import plan

    defaults.setdefault("builds", plan.MV_BUILDS)
    defaults.setdefault("norm_bytes", plan.MV_NORM_BYTES)
    defaults.setdefault("gated", plan.MV_GATED)
    if path is None:
        plan.MV_BUILDS, plan.MV_NORM_BYTES, plan.MV_GATED = defaults["builds"], defaults["norm_bytes"], defaults["gated"]
        return
    table = json.loads(path.read_text())
    plan.MV_GATED = table["gated"]
    plan.MV_BUILDS = tuple((top, None if d is None else tuple(map(tuple, d)), wps) for top, d, wps in table["builds"])
    plan.MV_NORM_BYTES = table["norm_bytes"]


def wait_for(path: Path, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.5)
    if not path.exists():
        print(f"{path} did not appear in {limit_s:.0f} s: timing beside other GPU work", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chats", default="1,16")
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quiet-after", metavar="FILE",
                    help="before the first timed cell, wait (at most 240 s) for FILE: the call's other GPU work is done")
    ap.add_argument("--profile", help="also profile the solo decode graph's kernels (bench/hybrid_profile.py) into this file")
    ap.add_argument("--matvec", default="on",
                    help="one-row kernels, comma-separated cells: on (matvec.cu as planned), off (matmul.cu's), or a "
                         "JSON file of matvec.cu builds (bench/probes/matvec_pick.py) to plan with")
    args = ap.parse_args(argv)
    import cupy as cp

    from lockstep_kernels.cuda.ops import CudaOps

    t = time.perf_counter()
    loaded = random_model()
    wbytes = weight_bytes(loaded)
    bound = COPY_BANDWIDTH / wbytes
    print(f"4b-hybrid weights {wbytes / 1e9:.2f} GB, made in {time.perf_counter() - t:.1f} s; solo bound "
          f"{bound:.0f} tok/s", flush=True)
    chats = [int(c) for c in args.chats.split(",")]
    per_seq = pages_for(args.prompt + 2 * args.gen + 8)
    report = {"shape": "4b-hybrid", "config": hf_config("4b-hybrid"), "weight_bytes": wbytes, "solo_bound_tps": round(bound, 1),
              "prompt": args.prompt, "generated": args.gen, "cells": {}}
    cells = [(mode, mv) for mv in args.matvec.split(",") for mode in args.modes.split(",")]
    for mode, mv in cells:
        ops = CudaOps(exact=mode == "on")
        ops.matvec = mv != "off"
        use_matvec_table(None if mv in ("on", "off") else Path(mv))
        label = mode if mv == args.matvec.split(",")[0] else f"{mode}/{Path(mv).stem}"
        runner = Runner(loaded, ops, max(chats) * per_seq, "f16", max_pages_per_seq=per_seq)
        rng = np.random.default_rng(1)
        run_cell(runner, 1, args.prompt, 2, rng)  # compiles the prompt and decode kernels: not timed
        if args.quiet_after:
            wait_for(Path(args.quiet_after), 240.0)
        for c in chats:
            cell = run_cell(runner, c, args.prompt, args.gen, rng, cp.cuda.Device().synchronize)
            cell["bandwidth_fraction"] = round(cell["decode_tps"] / c / bound, 3)
            cell["ahead_bandwidth_fraction"] = round(cell["decode_ahead_tps"] / c / bound, 3)
            cell["matvec"] = mv
            report["cells"].setdefault(label, []).append(cell)
            print(f"exact {label:<3} chats {c:>2}: decode {cell['decode_tps']:8.1f} tok/s ({cell['decode_step_ms']:.2f} "
                  f"ms a step, replay {cell.get('graph_replay_ms')} ms, {cell['bandwidth_fraction']:.2f} of the bound; "
                  f"launched ahead {cell['decode_ahead_tps']:.1f}, {cell['ahead_bandwidth_fraction']:.2f}), "
                  f"prefill {cell['prefill_tps']:8.1f} tok/s",
                  flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
        if args.profile and label == "on":
            from hybrid_profile import print_profile, profile_solo

            prof = profile_solo(runner)
            Path(args.profile).write_text(json.dumps(prof, indent=1))
            print_profile(prof)
        del runner
        cp.get_default_memory_pool().free_all_blocks()
    on = {c["chats"]: c for c in report["cells"].get("on", [])}
    if 1 in on and len(on) > 1:
        report["aggregate_over_solo"] = {c: round(v["decode_tps"] / on[1]["decode_tps"], 2) for c, v in on.items()}
    off = {c["chats"]: c for c in report["cells"].get("off", [])}
    report["on_over_off"] = {c: {k: round(on[c][k] / off[c][k], 3) for k in ("decode_tps", "prefill_tps")}
                             for c in on if c in off}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
