"""Where a decode step's time goes: replays a 1B or 8B decode-step graph (as gpu_ops.py builds it)
under the PyTorch profiler (CUPTI sees every kernel of a replayed graph, whoever launched it) and
prints each kernel position's median duration in the step, summed by kernel name and listed in
launch order for the first layer. Captured without PDL by default so that kernels do not overlap
and durations add up to the step.

    python3 bench/gpu_profile.py --shape 1B --batch 1 [--pdl] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import cupy as cp
import numpy as np

from bench.gpu_ops import decode_setup, step_inputs
from kernels.cuda import launch as kernel_launch


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


def profile_step(shape: str, batch: int, ctx: int, pdl: bool, reps: int) -> dict:
    supported = kernel_launch.pdl_supported
    if not pdl:
        kernel_launch.pdl_supported = lambda: False
    try:
        cfg, graphs, pages_per_seq, _ = decode_setup(True, shape, [batch], ctx)
        graphs(*step_inputs(batch, pages_per_seq, ctx))
        cp.cuda.Device().synchronize()
        g = graphs._graphs[batch].graph
        runs = kernel_times(lambda: g.launch(), reps)
    finally:
        kernel_launch.pdl_supported = supported
    if not runs:
        return {"shape": shape, "batch": batch, "error": "the profiler saw no kernels"}
    names = [k[0] for k in runs[0]]
    dur = np.median(np.array([[k[2] for k in r] for r in runs]), axis=0)
    span = float(np.median([r[-1][1] + r[-1][2] - r[0][1] for r in runs]))
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, d in zip(names, dur, strict=True):
        by_name[name][0] += float(d)
        by_name[name][1] += 1
    per_layer = len(names) // cfg.n_layers
    return {"shape": shape, "batch": batch, "ctx": ctx, "pdl": pdl, "kernels": len(names), "span_us": span,
            "busy_us": float(dur.sum()),
            "by_name": sorted(([n, round(t, 2), c] for n, (t, c) in by_name.items()), key=lambda r: -r[1]),
            "first_layer": [[n, round(float(d), 2)] for n, d in zip(names[:per_layer + 2], dur[:per_layer + 2], strict=True)],
            "tail": [[n, round(float(d), 2)] for n, d in zip(names[-6:], dur[-6:], strict=True)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1B", choices=("1B", "8B"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--ctx", type=int, default=600)
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    res = []
    for b in args.batch:
        r = profile_step(args.shape, b, args.ctx, args.pdl, args.reps)
        res.append(r)
        cp.get_default_memory_pool().free_all_blocks()
        if "error" in r:
            print(r)
            continue
        print(f"\n== {r['shape']} batch {b} ctx {r['ctx']} pdl={r['pdl']}: {r['kernels']} kernels, "
              f"span {r['span_us']:.1f} us, busy {r['busy_us']:.1f} us")
        for name, t, c in r["by_name"]:
            print(f"  {name:<28} {t:8.1f} us  x{c}")
        print("  first layer:", " | ".join(f"{n} {d}" for n, d in r["first_layer"]))
        print("  tail:", " | ".join(f"{n} {d}" for n, d in r["tail"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
