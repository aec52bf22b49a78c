"""mm_wide (the exact prefill matmul) under pipeline variants, on a GPU machine.

    python bench/wide_sweep.py --out wide-sweep.json

Each variant is the same kernel compiled with other WIDE_STAGES / WIDE_KC; every variant must give
the default's bits. (docs/lab/results/wide-sweep-h200.json also holds two diagnostic builds, one
without the MMAs and one without the pipeline's loads, made with build flags since removed.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_ops import random_weight, timed  # noqa: E402

from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.modules import big_smem_kernel  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

SHAPES = {"8B qo": (4096, 4096), "8B gate_up": (28672, 4096), "8B down": (4096, 14336), "1B gate_up": (16384, 2048)}
VARIANTS = [(3, 1), (4, 1), (6, 1), (3, 2), (4, 2), (2, 4)]  # (stages, 32-k chunks per stage)


def run_variant(ops: CudaOps, w, x16, m: int, n: int, stages: int, kc: int):
    defines = (("WIDE_STAGES", stages), ("WIDE_KC", kc))
    smem = plan.wide_smem("f16", stages, kc)
    fn = big_smem_kernel("matmul.cu", "mm_wide_f16", smem, defines)
    launch = plan.wide_launch("f16", m, n, w.shape[1], ops.sm_count)
    out = cp.empty((m, n), cp.float32)
    kp = int(w.data.shape[1])

    def go():
        fn(launch.grid, launch.block, (w.data, ops._dummy, x16, ops._dummy, ops._dummy, out, np.int32(m), np.int32(n),
                                       np.int32(kp), np.int32(w.data.shape[0]), np.int32(0), np.int32(launch.split)),
           shared_mem=smem)
    return timed(go), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="wide-sweep.json")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = random_weight(n, k, "f16")
        for m in (512, 2048):
            x16 = ops._act16(cp.random.standard_normal((m, k), dtype=cp.float32), int(w.data.shape[1]), False)
            ref = None
            for stages, kc in VARIANTS:
                try:
                    t, out = run_variant(ops, w, x16, m, n, stages, kc)
                except Exception as e:  # a variant that does not fit is reported, not fatal
                    rows.append({"shape": name, "m": m, "stages": stages, "kc": kc, "error": str(e)[:300]})
                    print(name, m, stages, kc, "FAILED", e, flush=True)
                    continue
                host = cp.asnumpy(out)
                ref = host if ref is None else ref
                row = {"shape": name, "m": m, "stages": stages, "kc": kc, "us": t * 1e6,
                       "TFLOPs": 2 * m * n * k / t / 1e12, "same_bits": host.tobytes() == ref.tobytes()}
                rows.append(row)
                print(f"{name:<11} M={m:<5} stages={stages} kc={kc} {t * 1e6:9.1f} us "
                      f"{row['TFLOPs']:7.1f} TFLOP/s  same={row['same_bits']}", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
