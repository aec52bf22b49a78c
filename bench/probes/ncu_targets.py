"""One kernel of interest, launched twice (compile, then the launch to profile), for Nsight Compute:
  ncu --launch-skip 1 --launch-count 1 -k regex:KERNEL python3 bench/probes/ncu_targets.py TARGET
Targets: wgmma (8B gate|up shape, 512 rows), tm1 / tm2 (the same at 1 / 16 rows), q4k1 / q4k16 (the
Q4_K_M gate|up, 28672 x 4096 Q4_K, at 1 / 16 rows), q6k1 (its Q6_K down, 4096 x 14336, one row),
attn_prefill (512 x 512, d 128), attn_decode (16 rows, context 640, d 128).
"""

from __future__ import annotations

import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import attention_inputs, random_weight  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402


def attention(ops: CudaOps, rows: int, ctx: int, prefill: bool) -> None:
    q, layer, pr = attention_inputs(ops, rows, ctx, 32, 8, 128, prefill)
    for _ in range(2):
        ops.attention(q, layer, pr, 128**-0.5)


def main() -> None:
    target = sys.argv[1]
    ops = CudaOps(exact=True)
    kq = {"q4k1": (28672, 4096, "q4_k", 1), "q4k16": (28672, 4096, "q4_k", 16), "q6k1": (4096, 14336, "q6_k", 1)}
    if target in kq:
        n, k, dtype, rows = kq[target]
        w, x = random_weight(n, k, dtype), cp.random.standard_normal((rows, k), dtype=cp.float32)
        for _ in range(2):
            ops.matmul(x, w)
    elif target in ("wgmma", "tm1", "tm2"):
        w = random_weight(14336, 4096, "f16")
        x = cp.random.standard_normal(({"wgmma": 512, "tm1": 1, "tm2": 16}[target], 4096), dtype=cp.float32)
        for _ in range(2):
            ops.matmul(x, w)
    elif target == "attn_prefill":
        attention(ops, 512, 512, True)
    elif target == "attn_decode":
        attention(ops, 16, 640, False)
    else:
        raise SystemExit(f"unknown target {target!r}; see --help in the docstring")
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
