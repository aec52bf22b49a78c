"""Runs wgmma_gemm.cu (built by nvcc for sm_90a, in each of VARIANTS' pipeline depths) on the 8B
and 1B prefill shapes at 512 rows: the fraction of outputs with mm_wide's bits (the exact path), the
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
SHAPES = {"qo": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "1b_qo": (2048, 2048), "1b_gate_up": (16384, 2048), "1b_down": (2048, 8192)}
ROWS = 512
VARIANTS = {"kc1t6": (1, 6), "kc1t8": (1, 8), "kc2t5": (2, 5), "kc2t6": (2, 6)}  # chunks per stage, stages
# The k order of a chunk's tokens in shared memory: slot j holds k PERM[j] (see wgmma_gemm.cu).
PERM = [0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
        4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    ex, off = CudaOps(exact=True), CudaOps(exact=False)
    res: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        fns = {}
        for key, (kc, stages) in VARIANTS.items():
            cubin = str(Path(tmp) / f"{key}.cubin")
            subprocess.run(["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", f"-DTSTAGES={stages}",
                            f"-DKC={kc}", "-o", cubin, str(HERE / "wgmma_gemm.cu")], check=True)
            fn = cp.RawModule(path=cubin).get_function("wg_gemm_f16")
            fn.max_dynamic_shared_size_bytes = stages * kc * 2 * 128 * 64 + 1024
            fns[key] = fn
        for name, (n, k) in SHAPES.items():
            row: dict = {"shape": name, "n": n, "k": k, "m": ROWS}
            try:
                w = random_weight(n, k, "f16")
                x = cp.random.standard_normal((ROWS, k), dtype=cp.float32)
                kp, np_ = int(w.data.shape[1]), int(w.data.shape[0])
                x16 = ex._act16(x, kp, False)
                xp = cp.ascontiguousarray(x16.reshape(ROWS, kp // 32, 32)[:, :, PERM].reshape(ROWS, kp))
                want = ex.matmul(x, w)
                split = plan.split_k(n, k, ex.sm_count)
                grid = (plan.ceil_div(n, 128), plan.ceil_div(ROWS, 128), 1)
                flops = 2 * ROWS * n * k
                for key, fn in fns.items():
                    out = cp.zeros((ROWS, n), cp.float32)
                    args_ = (w.data, xp, out, np.int32(ROWS), np.int32(n), np.int32(kp), np.int32(np_), np.int32(split))

                    def run(fn=fn, args_=args_, grid=grid):
                        fn(grid, (256, 1, 1), args_, shared_mem=fn.max_dynamic_shared_size_bytes)

                    run()
                    cp.cuda.Device().synchronize()
                    row[f"{key}_bits_equal"] = float((out.view(cp.uint32) == want.view(cp.uint32)).mean())
                    row[f"{key}_rel_err"] = float(cp.linalg.norm(out - want) / cp.linalg.norm(want))
                    row[f"{key}_TFLOPs"] = flops / timed(run, graph=True) / 1e12
                for key, f, graph in (("mm_wide", lambda w=w, x=x: ex.matmul(x, w), True),
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
