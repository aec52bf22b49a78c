"""Runs wgmma_gemm.cu (built by nvcc for sm_90a) on the 8B
prefill shapes at 512 rows: the fraction of outputs with mm_wide's bits (the exact path), the
relative error, and TFLOP/s of the wgmma kernel alone, of mm_wide (with its activation conversion)
and of cuBLAS (exact off). Prints JSON; --out writes it too.

    python3 bench/probes/wgmma_gemm.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import cupy as cp
import numpy as np

from bench.gpu_ops import random_weight, timed
from kernels.cuda import plan
from kernels.cuda.ops import CudaOps

HERE = Path(__file__).parent
SHAPES = {"qo": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = 512
SMEM = 4 * 2 * 128 * 64  # STAGES * STAGE_BYTES of the kernel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    ex, off = CudaOps(exact=True), CudaOps(exact=False)
    res: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        cubin = str(Path(tmp) / "wg.cubin")
        subprocess.run(["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-o", cubin,
                        str(HERE / "wgmma_gemm.cu")], check=True)
        fn = cp.RawModule(path=cubin).get_function("wg_gemm_f16")
        fn.max_dynamic_shared_size_bytes = SMEM
        for name, (n, k) in SHAPES.items():
            row: dict = {"shape": name, "n": n, "k": k, "m": ROWS}
            try:
                w = random_weight(n, k, "f16")
                x = cp.random.standard_normal((ROWS, k), dtype=cp.float32)
                kp, np_ = int(w.data.shape[1]), int(w.data.shape[0])
                x16 = ex._act16(x, kp, False)
                want = ex.matmul(x, w)
                out = cp.zeros((ROWS, n), cp.float32)
                split = plan.split_k(n, k, ex.sm_count)
                grid = (plan.ceil_div(n, 128), plan.ceil_div(ROWS, 128), 1)
                args_ = (w.data, x16, out, np.int32(ROWS), np.int32(n), np.int32(kp), np.int32(np_), np.int32(split))

                def run(args_=args_, grid=grid):
                    fn(grid, (256, 1, 1), args_, shared_mem=SMEM)

                run()
                cp.cuda.Device().synchronize()
                row["bits_equal_to_mm_wide"] = float((out.view(cp.uint32) == want.view(cp.uint32)).mean())
                row["rel_err_vs_mm_wide"] = float(cp.linalg.norm(out - want) / cp.linalg.norm(want))
                flops = 2 * ROWS * n * k
                for key, f, graph in (("wgmma", run, True), ("mm_wide", lambda w=w, x=x: ex.matmul(x, w), True),
                                      ("cublas", lambda w=w, x=x: off.matmul(x, w), False)):
                    row[f"{key}_TFLOPs"] = flops / timed(f, graph=graph) / 1e12
            except Exception as e:  # noqa: BLE001 - a probe reports every shape's failure
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            res.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
