"""A/B of the one-row matmul's L2 prefetch (plan.L2_PREFETCH_BYTES) behind a short kernel, as a
decode graph has it: rms_norm then the matmul of its row, over rotating weight copies, captured
in a graph (so with PDL), at each prefetch budget; outputs compared bit for bit with budget 0.

    python3 bench/probes/l2_prefetch_ab.py [--out FILE] [--budgets-mb 0,8,16,24,32,48]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import ROTATE_BYTES, random_weight, timed, write_json  # noqa: E402
from kernels.cuda import plan  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

# the 4B hybrid's one-row matmuls that follow a norm in a decode step (name, n, k)
SHAPES = [("dn_out", 2560, 4096), ("gate_up", 18432, 2560), ("lm_head", 248320, 2560), ("down", 2560, 9216)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--budgets-mb", default="0,8,16,24,32,48")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    budgets = [int(b) << 20 for b in args.budgets_mb.split(",")]
    saved, res = plan.L2_PREFETCH_BYTES, []
    l2 = int(cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
    print(f"L2 {l2 / 2**20:.0f} MiB", flush=True)
    for name, n, k in SHAPES:
        w0 = random_weight(n, k, "f16")
        ws = [w0] + [random_weight(n, k, "f16") for _ in range(max(1, min(16, ROTATE_BYTES // w0.nbytes)) - 1)]
        x = cp.random.standard_normal((1, k), dtype=cp.float32)
        nw = cp.random.standard_normal(k, dtype=cp.float32)
        ref = None
        for budget in budgets:
            plan.L2_PREFETCH_BYTES = budget
            out = ops.matmul(ops.rms_norm(x, nw, 1e-6), w0, prefetch=True)
            bits = cp.asnumpy(out).view(np.uint32)
            ref = bits if ref is None else ref

            def run(ws=ws, x=x, nw=nw):
                for w in ws:
                    ops.matmul(ops.rms_norm(x, nw, 1e-6), w, prefetch=True)

            t = timed(run) / len(ws)
            r = {"name": name, "n": n, "k": k, "budget_mb": budget >> 20, "us": round(t * 1e6, 2), "l2_bytes": l2,
                 "chunks": plan.prefetch_chunks(n, k, plan.split_k(n, k, ops.sm_count)) if budget else 0,
                 "weight_GBps": round(w0.nbytes / t / 1e9, 1), "bits_equal": bool(np.array_equal(bits, ref))}
            res.append(r)
            print(f"{name:<8} budget {r['budget_mb']:>3} MB: norm+matmul {r['us']:8.2f} us "
                  f"({r['weight_GBps']:6.0f} GB/s) bits equal {r['bits_equal']}", flush=True)
            write_json(args.out, res)
        ws = w0 = None
        cp.get_default_memory_pool().free_all_blocks()
    plan.L2_PREFETCH_BYTES = saved
    return 0 if all(r["bits_equal"] for r in res) else 1


if __name__ == "__main__":
    raise SystemExit(main())
