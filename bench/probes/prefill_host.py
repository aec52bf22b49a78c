"""Probe: the host's share of one prompt's forward pass (1B prompts are host-bound).

Times the forward pass of one N-token prompt as the engine launches it (gpu_profile.prompt_forward):
wall time with a device sync, host time to issue it without one, and cProfile's top functions by
own time, exact on and off.
  python3 bench/probes/prefill_host.py --shape 1B --prefill 512 --out results.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_profile import prompt_forward  # noqa: E402


def measure(shape: str, tokens: int, exact: bool, reps: int) -> dict:
    _, forward = prompt_forward(shape, tokens, exact)
    forward()
    cp.cuda.Device().synchronize()
    wall, host = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward()
        t1 = time.perf_counter()
        cp.cuda.Device().synchronize()
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        forward()
    prof.disable()
    cp.cuda.Device().synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return {"shape": shape, "prefill": tokens, "exact": exact, "wall_ms": statistics.median(wall) * 1e3,
            "host_ms": statistics.median(host) * 1e3, "profile": text.getvalue()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1B", choices=("1B", "8B"))
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    res = []
    for exact in (True, False):
        r = measure(a.shape, a.prefill, exact, a.reps)
        res.append(r)
        print(f"== exact {exact}: wall {r['wall_ms']:.2f} ms, host {r['host_ms']:.2f} ms")
        print(r["profile"])
        cp.get_default_memory_pool().free_all_blocks()
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
