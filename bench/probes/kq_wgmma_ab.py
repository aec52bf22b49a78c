"""mm_wide against mm_wgmma_kq (wgmma_kq.cu) on the 8B prefill shapes with Q4_K weights (and Q6_K for
down, as Q4_K_M has it in half the layers): median us of the engine's whole matmul (act_to_16, and for
Q4_K's mm_wgmma_kq the ones sums' pass), TFLOP/s, and whether every element has mm_wide's and mm_tc's
bits (the epilogues the engine uses: q|k|v plain, o and down with the residual, gate|up with SiLU).
Builds (stages, pipelined slices, Q4_K's token slices, cp.async planes, joined slices in registers): `kq` the
plan's, `kq_s4` 4 stages, `kq_sl4` 4 token slices, `kq_reg` 4 token slices and the joined K slices in registers,
`kq_serial` KG_PIPE 0, `kq_bulk` a bulk copy a plane run (4 stages); `ones_us`: the ones sums' pass alone.
  python3 bench/probes/kq_wgmma_ab.py --rows 512,2048 --out x.json"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import random_weight, timed  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.arrays import i32  # noqa: E402
from lockstep_kernels.cuda.launch import launch  # noqa: E402
from lockstep_kernels.cuda.modules import kernel  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

TEST_BUILDS = [(4, 1, 2, 1, 0), (4, 1, 4, 1, 0), (6, 1, 4, 1, 0), (6, 0, 2, 1, 0), (4, 1, 2, 0, 0), (6, 1, 4, 1, 1)]  # the tests'
SHAPES = {"qkv": (6144, 4096, None, "q4_k"), "o": (4096, 4096, "res", "q4_k"), "gate_up": (28672, 4096, "gate", "q4_k"),
          "down": (4096, 14336, "res", "q4_k"), "down_q6k": (4096, 14336, "res", "q6_k")}
BUILDS = {"kq": (plan.WGMMA_KQ_STAGES, plan.WGMMA_KQ_PIPE, plan.WGMMA_KQ_SLICES, plan.WGMMA_KQ_CPASYNC, plan.WGMMA_KQ_TOTAL_REGS),
          "kq_s4": (4, 1, 2, 1, 0), "kq_sl4": (6, 1, 4, 1, 0), "kq_reg": (6, 1, 4, 1, 1), "kq_serial": (6, 0, 2, 1, 0),
          "kq_bulk": (4, 1, 2, 0, 0)}
KNOBS = ("WGMMA_KQ_STAGES", "WGMMA_KQ_PIPE", "WGMMA_KQ_SLICES", "WGMMA_KQ_CPASYNC", "WGMMA_KQ_TOTAL_REGS")


def use(build: str) -> None:
    for knob, v in zip(KNOBS, BUILDS[build], strict=True):
        setattr(plan, knob, v)


def _build(job: tuple) -> float:
    """One module into CuPy's disk cache, in a process of its own (NVRTC compiles one at a time a process)."""
    from lockstep_kernels.cuda.modules import module

    t0 = time.perf_counter()
    module(*job).get_function("act_to_16" if job[0] == "matmul.cu" else "mm_wgmma_kq_q4k")  # compiles the whole source
    return time.perf_counter() - t0


def compile_all(builds: list[str]) -> None:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    wide = (("WIDE_STAGES", plan.WIDE_STAGES), ("WIDE_KC", plan.WIDE_KC))
    jobs = [("matmul.cu", ()), ("matmul.cu", wide)]
    for st, pipe, slices, cpasync, regs in dict.fromkeys([BUILDS[b] for b in builds] + TEST_BUILDS):
        jobs.append(("wgmma_kq.cu", (("KG_STAGES", st), ("KG_PIPE", pipe), ("KG_SLICES", slices), ("KG_CPASYNC", cpasync),
                                     ("KG_TOTAL_REGS", regs))))
    with ProcessPoolExecutor(len(jobs), mp_context=get_context("spawn")) as pool:
        took = list(pool.map(_build, jobs))
    print(f"compiled {len(jobs)} modules, longest {max(took):.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="512,2048")
    ap.add_argument("--builds", default=",".join(BUILDS))
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compile", action="store_true",
                    help="only build the probe's (and the GPU tests') modules, side by side, into CuPy's cache")
    a = ap.parse_args()
    if a.compile:
        compile_all(a.builds.split(","))
        return
    kq, wide, tc = CudaOps(exact=True), CudaOps(exact=True), CudaOps(exact=True)
    wide.tiled, tc.tiled = "wide", False
    plan.WGMMA_KQ = True
    cells = []
    t0 = time.perf_counter()
    for name, (n, k, epi, dtype) in SHAPES.items():
        w = random_weight(n, k, dtype)
        if epi == "gate":
            w = dataclasses.replace(w, gate_up="tiles")
        for m in map(int, a.rows.split(",")):
            x = cp.random.standard_normal((m, k), dtype=cp.float32)
            res = cp.random.standard_normal((m, n), dtype=cp.float32) if epi == "res" else None

            def run(ops, x=x, w=w, res=res):
                return ops.matmul(x, w, residual=res)

            flops = 2.0 * m * n * k
            ref_wide = cp.asnumpy(run(wide))
            ref_tc = cp.asnumpy(run(tc))
            cell = {"shape": name, "dtype": dtype, "m": m, "n": n, "k": k, "split": plan.split_k(n, k, kq.sm_count, dtype),
                    "family": kq.matmul_family(m, w), "mm_wide_same_bits_as_mm_tc": bool(ref_wide.tobytes() == ref_tc.tobytes())}
            us = timed(lambda: run(wide), a.reps) * 1e6
            cell["mm_wide"] = {"us": round(us, 2), "tflops": round(flops / us / 1e6, 1)}
            for b in a.builds.split(","):
                use(b)
                got = cp.asnumpy(run(kq))
                us = timed(lambda: run(kq), a.reps) * 1e6
                cell[b] = {"us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
                           "same_bits_as_mm_wide": bool(got.tobytes() == ref_wide.tobytes()),
                           "same_bits_as_mm_tc": bool(got.tobytes() == ref_tc.tobytes()),
                           "differ": int((got != ref_tc).sum())}
                Path(a.out).write_text(json.dumps({"partial": True, "cells": [*cells, cell]}, indent=1))
            use("kq")
            if dtype != "q4_k":
                print(json.dumps(cell), flush=True)
                cells.append(cell)
                Path(a.out).write_text(json.dumps({"partial": True, "cells": cells}, indent=1))
                continue
            x16 = kq._act16(x, w.kp, False, perm=True)
            e = cp.empty((plan.ceil_div(m, plan.WIDE_M), k // 32, plan.WIDE_M), dtype=cp.float32)
            grid, block = plan.q4k_ones_grid(m, k)
            args = (x16, e, i32(m), i32(k))
            cell["ones_us"] = round(timed(lambda g=grid, b=block, args=args: launch(
                kernel("matmul.cu", "q4k_ones_sums"), g, b, args), a.reps) * 1e6, 2)
            print(json.dumps(cell), flush=True)
            cells.append(cell)
            Path(a.out).write_text(json.dumps({"partial": True, "cells": cells}, indent=1))  # a cut-short run keeps these
        del w
        cp.get_default_memory_pool().free_all_blocks()
    layer = {}
    for m in map(int, a.rows.split(",")):
        rows = [c for c in cells if c["m"] == m and c["dtype"] == "q4_k"]
        layer[m] = {b: round(sum(c[b]["us"] for c in rows), 1) for b in ["mm_wide", *a.builds.split(",")]}
    out = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cells": cells,
           "layer_us (q|k|v + o + gate|up + down, Q4_K)": layer,
           "all_bits_equal": all(c[b]["same_bits_as_mm_tc"] and c[b]["same_bits_as_mm_wide"]
                                 for c in cells for b in a.builds.split(",")),
           "median_speedup_kq": round(statistics.median(c["mm_wide"]["us"] / c["kq"]["us"] for c in cells), 3)
           if "kq" in a.builds.split(",") else None, "seconds": round(time.perf_counter() - t0, 1)}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "cells"}))


if __name__ == "__main__":
    main()
