"""The dense 1B and 8B shapes' decode steps (bench/gpu_ops.bench_decode_step: graph replays, PDL) with the
one-row builds of issue 31 off and on, in one process: each build is a set of LOCKSTEP_* variables read
when its CudaOps is made (LOCKSTEP_MM_CLUSTER, LOCKSTEP_MM_GATED, LOCKSTEP_MM_SUMS).

    python3 bench/probes/dense_decode_ab.py --builds "base:,sums:LOCKSTEP_MM_SUMS=1" [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import bench_decode_step, write_json  # noqa: E402

VARIABLES = ("LOCKSTEP_MM_CLUSTER", "LOCKSTEP_MM_GATED", "LOCKSTEP_MM_SUMS")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--builds", default="base:,on:LOCKSTEP_MM_SUMS=1")
    ap.add_argument("--shapes", default="1B,8B")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = []
    for build in args.builds.split(","):
        name, _, env = build.partition(":")
        for v in VARIABLES:
            os.environ.pop(v, None)
        os.environ.update(dict(kv.split("=", 1) for kv in env.split(";") if kv))
        for shape in args.shapes.split(","):
            for r in bench_decode_step(True, shape, [int(b) for b in args.batches.split(",")], args.ctx):
                r["build"] = name
                print(f"{name:8} {shape} batch {r['batch']:>2}: {r['step_ms']:.3f} ms, {r['tok_s']:.1f} tok/s, "
                      f"{r['bandwidth_TBps']:.2f} TB/s", flush=True)
                rows.append(r)
                write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
