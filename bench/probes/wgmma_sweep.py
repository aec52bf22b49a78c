"""mm_wgmma_tma at 512 rows on the 8B shapes with other pipeline stages or K splits than the plan's
(a split other than plan.split_k sums differently: timing only; each slice ends with every MMA
drained):
  python3 bench/probes/wgmma_sweep.py [--stages N] [--splits plan,4,1]"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import bench_matmul  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "qo": (4096, 4096), "gate_up": (14336, 4096), "gate_up_fused": (28672, 4096),
          "down": (4096, 14336)}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--stages", type=int, default=plan.WGMMA_STAGES)
ap.add_argument("--splits", default="plan")
a = ap.parse_args()
plan.WGMMA_STAGES = a.stages
ex = CudaOps(exact=True)
planned = plan.split_k
try:
    for name, (n, k) in SHAPES.items():
        for split in a.splits.split(","):
            plan.split_k = planned if split == "plan" else (lambda n, k, sm, s=int(split): s)
            r = bench_matmul(ex, n, k, 512, "f16")
            print(f"stages {a.stages} {name:14s} split {plan.split_k(n, k, ex.sm_count):2d} "
                  f"{r['TFLOPs']:6.1f} TFLOP/s {r['us']:6.1f} us", flush=True)
finally:
    plan.split_k = planned
