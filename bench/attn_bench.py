"""One layer's attention on the GPU at long contexts: the tensor-core kernel against the scalar one.

    python bench/attn_bench.py --out /tmp/attn.json      # on a GPU machine (8B shape: 32 heads, 8 KV, 128)

Prefill: 512 rows ending at the context length (a prompt's last ubatch); decode: one row (and 16
rows of 4k contexts). Reports ms per launch, TFLOP/s of the score and value products (prefill,
causal) and the KV bytes read per second (decode), with the two kernels' outputs compared.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_ops import back_to_back_ms  # noqa: E402
from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kv", default="f16", choices=("f16",))
    ap.add_argument("--out", default="/tmp/attn-bench.json")
    args = ap.parse_args()
    H, HKV, D = args.heads, args.kv_heads, args.head_dim
    ops = CudaOps(exact=True)
    ctx = 32768
    n_pages = ctx // PAGE_SIZE * 17 + 4  # one long sequence and 16 of 4k
    layer = ops.kv_alloc(n_pages, HKV, D, args.kv)
    rng = np.random.default_rng(0)
    for a in (layer.k, layer.v):  # random f16 values (the kernels read the bits they are given)
        a[...] = cp.random.default_rng(0).standard_normal(a.shape, dtype=cp.float32).astype(cp.float16).view(a.dtype)
    width = ctx // PAGE_SIZE
    tables = np.zeros((17, width), np.int32)
    tables[0] = np.arange(width)
    for s in range(1, 17):
        tables[s, :16] = width + (s - 1) * 16 + np.arange(16)
    dev_tables = cp.asarray(tables)
    results = []

    def run(name, positions, seqs, flops, kv_bytes):
        t = len(positions)
        q = cp.asarray(rng.standard_normal((t, H, D), np.float32))
        rows = PagedRows(cp.asarray(np.asarray(positions, np.int32)), cp.asarray(np.asarray(seqs, np.int32)),
                         dev_tables, None)
        row = {"cell": name, "rows": t}
        outs = {}
        for kern, dims in (("mma", plan.MMA_HEAD_DIMS), ("scalar", ())):
            saved = plan.MMA_HEAD_DIMS
            plan.MMA_HEAD_DIMS = dims
            try:
                ms = back_to_back_ms(lambda: ops.attention(q, layer, rows, D**-0.5), 10 if t > 1 else 50)
                outs[kern] = cp.asnumpy(ops.attention(q, layer, rows, D**-0.5))
            finally:
                plan.MMA_HEAD_DIMS = saved
            row[kern] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1),
                         "kv_gbps": round(kv_bytes / ms / 1e6, 1)}
        a, b = outs["mma"], outs["scalar"]
        row["rel_diff_vs_scalar"] = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        row["speedup"] = round(row["scalar"]["ms"] / row["mma"]["ms"], 2)
        results.append(row)
        print(json.dumps(row), flush=True)

    cell_bytes = HKV * D * 2 * 2
    for L in (2048, 8192, 32768):
        pos = np.arange(L - 512, L)
        keys = (pos + 1).sum()
        run(f"prefill-512-at-{L}", pos, np.zeros(512, int), keys * H * D * 4, keys * cell_bytes)
    for L in (8192, 32768):
        run(f"decode-1-at-{L}", [L - 1], [0], L * H * D * 4, L * cell_bytes)
    run("decode-16-at-4096", [4095] * 16, list(range(1, 17)), 16 * 4096 * H * D * 4, 16 * 4096 * cell_bytes)
    Path(args.out).write_text(json.dumps({"shape": [H, HKV, D, args.kv], "cells": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
