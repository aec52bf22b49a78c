"""Where a decode step's time goes: replays a 1B or 8B decode-step graph (as gpu_ops.py builds it)
under the PyTorch profiler (CUPTI sees every kernel of a replayed graph, whoever launched it) and
prints each kernel position's median duration in the step, summed by kernel name and listed in
launch order for the first layer. Captured without PDL by default so that kernels do not overlap
and durations add up to the step. With --prefill N: the forward pass over one N-token prompt
instead (launched from Python as the engine does, exact on or, with --exact-off, off).

    python3 bench/gpu_profile.py --shape 1B --batch 1 [--pdl] [--out FILE]
    python3 bench/gpu_profile.py --shape 8B --prefill 512 [--exact-off]
    python3 bench/gpu_profile.py --gguf /tmp/shape-8b-q4km.gguf --batch 1 16   (a file's model, e.g. K-quants)
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import defaultdict

import cupy as cp
import numpy as np

from bench.gpu_ops import decode_setup, model_setup, step_inputs
from lockstep_kernels.base import PagedRows
from lockstep_kernels.cuda import launch as kernel_launch


def kernel_times(replay, reps: int) -> list[list[tuple[str, float, float]]]:
    """Per replay, its kernels in start order as (name, start us, duration us)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            replay()
        cp.cuda.Device().synchronize()
    events = sorted(((e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
                     if e.device_type == DeviceType.CUDA and "memcpy" not in e.name.lower()
                     and "memset" not in e.name.lower()), key=lambda e: e[1])
    n = len(events) // reps
    return [events[i * n:(i + 1) * n] for i in range(reps)] if n else []


def profile_step(shape: str, batch: int, ctx: int, pdl: bool, reps: int, gguf: str | None = None) -> dict:
    supported = kernel_launch.pdl_supported
    if not pdl:
        kernel_launch.pdl_supported = lambda: False
    try:
        cfg, graphs, pages_per_seq, _ = decode_setup(True, shape, [batch], ctx, gguf=gguf)
        out = cp.asnumpy(graphs(*step_inputs(batch, pages_per_seq, ctx)))
        g = graphs._graphs[batch].graph
        runs = kernel_times(lambda: g.launch(), reps)
    finally:
        kernel_launch.pdl_supported = supported
    head = {"shape": gguf or shape, "batch": batch, "ctx": ctx, "pdl": pdl,
            "output_sha1": hashlib.sha1(out.tobytes()).hexdigest()}  # two builds' steps compared bit for bit
    return summarize(runs, head, cfg.n_layers)


def prompt_forward(shape: str, tokens: int, exact: bool):
    """(cfg, forward): forward() runs one prompt of `tokens` through the model, as the engine runs a
    prompt chunk."""
    cfg, ops, model, pool, pages = model_setup(exact, shape, 1, tokens)
    pos = np.arange(tokens)
    table = np.arange(pages, dtype=np.int32)
    rows = PagedRows(ops.tensor(pos.astype(np.int32)), ops.tensor(np.zeros(tokens, np.int32)), ops.tensor(table[None]),
                     ops.tensor(table[pos // 256].astype(np.int64) * 256 + pos % 256))
    ids = ops.tensor((pos % cfg.vocab_size).astype(np.int32))
    last = ops.tensor(np.array([tokens - 1], np.int64))

    def forward():
        model.forward(ids, rows, pool.layers, last)

    return cfg, forward


def profile_prefill(shape: str, tokens: int, exact: bool, reps: int) -> dict:
    cfg, forward = prompt_forward(shape, tokens, exact)
    forward()  # compiles every kernel
    cp.cuda.Device().synchronize()
    runs = kernel_times(forward, reps)
    return summarize(runs, {"shape": shape, "prefill": tokens, "exact": exact}, cfg.n_layers)


def summarize(runs, head: dict, n_layers: int) -> dict:
    if not runs:
        return {**head, "error": "the profiler saw no kernels"}
    names = [k[0] for k in runs[0]]
    dur = np.median(np.array([[k[2] for k in r] for r in runs]), axis=0)
    span = float(np.median([r[-1][1] + r[-1][2] - r[0][1] for r in runs]))
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, d in zip(names, dur, strict=True):
        by_name[name][0] += float(d)
        by_name[name][1] += 1
    per_layer = len(names) // n_layers
    return {**head, "kernels": len(names), "span_us": span,
            "busy_us": float(dur.sum()),
            "by_name": sorted(([n, round(t, 2), c] for n, (t, c) in by_name.items()), key=lambda r: -r[1]),
            "first_layer": [[n, round(float(d), 2)] for n, d in zip(names[:per_layer + 2], dur[:per_layer + 2], strict=True)],
            "tail": [[n, round(float(d), 2)] for n, d in zip(names[-6:], dur[-6:], strict=True)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1B", choices=("1B", "8B"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--ctx", type=int, nargs="+", default=[600], help="positions decoded at (each its own step)")
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--prefill", type=int, help="profile one prompt of this many tokens instead")
    ap.add_argument("--exact-off", action="store_true", help="with --prefill: exact mode off (cuBLAS)")
    ap.add_argument("--gguf", help="decode steps of this file's model instead of the random --shape")
    ap.add_argument("--out")
    args = ap.parse_args()
    res = []
    runs = ([lambda: profile_prefill(args.shape, args.prefill, not args.exact_off, args.reps)] if args.prefill else
            [lambda b=b, c=c: profile_step(args.shape, b, c, args.pdl, args.reps, args.gguf) for c in args.ctx for b in args.batch])
    for run in runs:
        r = run()
        res.append(r)
        cp.get_default_memory_pool().free_all_blocks()
        if "error" in r:
            print(r)
            continue
        what = " ".join(f"{k} {v}" for k, v in r.items() if k in ("shape", "batch", "ctx", "pdl", "prefill", "exact", "output_sha1"))
        print(f"\n== {what}: {r['kernels']} kernels, span {r['span_us']:.1f} us, busy {r['busy_us']:.1f} us")
        for name, t, c in r["by_name"]:
            print(f"  {name:<28} {t:8.1f} us  x{c}")
        print("  first layer:", " | ".join(f"{n} {d}" for n, d in r["first_layer"]))
        print("  tail:", " | ".join(f"{n} {d}" for n, d in r["tail"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
