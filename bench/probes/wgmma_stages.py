"""mm_wgmma_tma at 512 rows on the 8B shapes with a given number of pipeline stages:
  python3 bench/probes/wgmma_stages.py STAGES"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels.cuda import plan  # noqa: E402

plan.WGMMA_STAGES = int(sys.argv[1])

from bench.gpu_ops import bench_matmul  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

ex = CudaOps(exact=True)
for name, (n, k) in {"qo": (4096, 4096), "gate_up": (14336, 4096), "gate_up_fused": (28672, 4096),
                     "down": (4096, 14336)}.items():
    r = bench_matmul(ex, n, k, 512, "f16")
    print("stages", sys.argv[1], name, round(r["TFLOPs"], 1), "TFLOP/s", round(r["us"], 1), "us", flush=True)
