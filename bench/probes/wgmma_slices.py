"""mm_wgmma_tma at 512 rows on the 8B shapes with the plan's K slices against fewer (timing only: a
different split sums differently). Each slice ends with every MMA drained (wait_group 0):
  python3 bench/probes/wgmma_slices.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import bench_matmul  # noqa: E402
from kernels.cuda import plan  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

ex = CudaOps(exact=True)
planned = plan.split_k
for name, (n, k) in {"qkv": (6144, 4096), "qo": (4096, 4096), "gate_up_fused": (28672, 4096),
                     "down": (4096, 14336)}.items():
    for split in (None, 4, 1):
        plan.split_k = planned if split is None else (lambda n, k, sm, s=split: s)
        r = bench_matmul(ex, n, k, 512, "f16")
        print(f"{name:14s} split {plan.split_k(n, k, ex.sm_count):2d} {r['TFLOPs']:6.1f} TFLOP/s {r['us']:6.1f} us",
              flush=True)
plan.split_k = planned
