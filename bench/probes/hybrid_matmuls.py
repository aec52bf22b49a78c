"""The 4B hybrid's one-row (decode) matmuls on the streaming kernel: weight bandwidth at the split
plan.split_k picks and at the other splits (a split is a summation order: benchmarks only).

    python3 bench/probes/hybrid_matmuls.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import bench_matmul, write_json  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

# (name, n, k) of one decode step's matrices; per step: 24 DeltaNet, 8 attention, 32 FFN layers
SHAPES = [("dn_in", 12352, 2560), ("dn_out", 2560, 4096), ("attn_qkv", 10240, 2560), ("attn_o", 2560, 4096),
          ("gate_up", 18432, 2560), ("down", 2560, 9216), ("lm_head", 248320, 2560)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    res = []
    for name, n, k in SHAPES:
        picked = plan.split_k(n, k, ops.sm_count)
        for split in sorted({picked, *(s for s in (4, 8, 16, 32) if s * plan.K_CHUNK <= k)}):
            r = bench_matmul(ops, n, k, 1, "f16", None if split == picked else split)
            r.update(name=name, picked=split == picked)
            res.append(r)
            print(f"{name:<9} n {n:>6} k {k:>5} split {split:>2}{'*' if split == picked else ' '} "
                  f"{r['us']:8.2f} us {r['weight_GBps']:7.0f} GB/s", flush=True)
            write_json(args.out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
