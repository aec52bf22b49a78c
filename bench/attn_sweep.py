"""Tensor-core attention launches at long contexts, timed from CUDA graphs (8B shape: 32 heads, 8 KV, 128):
decode rows under other launch plans (warps a block, blocks an SM), which must give the same bits, and
512-row prefill tiles, each also with expf softmax weights (MMA_EX2 0: other bits, same_bits false);
then the attention kernels' own durations in one decode launch (CUPTI).

    python3 bench/attn_sweep.py --out /tmp/attn-sweep.json      # on a GPU machine

Each cell reads several copies of its cache in turn (past the 60 MB L2), one launch per copy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_ops import timed  # noqa: E402
from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

H, HKV, D = 32, 8, 128
CELL_BYTES = HKV * D * 2 * 2  # K and V of one position, f16
DECODE_PLANS = [{}, {"MMA_DIM_WARPS": 1, "MMA_BLOCKS_PER_SM": 4}, {"MMA_DIM_WARPS": 2}, {"MMA_BLOCKS_PER_SM": 2},
                {"MMA_BLOCKS_PER_SM": 6}, {"MMA_BLOCKS_PER_SM": 12}, {"MMA_BLOCKS_PER_SM": 1000}, {"MMA_DIM_WARPS": 1},
                {"MMA_EX2": 0}]


def cache(ops, seqs: int, length: int, copies: int):
    """`copies` layers of `seqs` sequences of `length` positions, random f16 K/V, and their tables."""
    pages = -(-length // PAGE_SIZE)
    layers = []
    for i in range(copies):
        layer = ops.kv_alloc(seqs * pages, HKV, D, "f16")
        for a in (layer.k, layer.v):
            a[...] = cp.random.default_rng(i).standard_normal(a.shape, dtype=cp.float32).astype(cp.float16).view(a.dtype)
        layers.append(layer)
    tables = cp.asarray(np.arange(seqs * pages, dtype=np.int32).reshape(seqs, pages))
    return layers, tables


def run_cell(ops, name: str, positions, seqs, length: int, plans: list[dict]) -> list[dict]:
    n_seqs = int(max(seqs)) + 1
    keys = int((np.asarray(positions) + 1).sum())
    copies = max(1, min(8, -(-(512 << 20) // max(1, keys * CELL_BYTES))))
    layers, tables = cache(ops, n_seqs, length, copies)
    rng = np.random.default_rng(0)
    q = cp.asarray(rng.standard_normal((len(positions), H, D), np.float32))
    rows = PagedRows(cp.asarray(np.asarray(positions, np.int32)), cp.asarray(np.asarray(seqs, np.int32)), tables, None)
    out, base = [], None
    for over in plans:
        saved = {k: getattr(plan, k) for k in over}
        try:
            for k, v in over.items():
                setattr(plan, k, v)
            at = plan.mma_attention_launch(len(positions), H, HKV, D, int(tables.shape[1]), ops.sm_count)
            got = cp.asnumpy(ops.attention(q, layers[0], rows, D**-0.5))
            s = timed(lambda: [ops.attention(q, layer, rows, D**-0.5) for layer in layers]) / copies
        finally:
            for k, v in saved.items():
                setattr(plan, k, v)
        base = got if base is None else base
        row = {"cell": name, "rows": len(positions), "plan": over, "workers": at.workers, "threads": at.threads,
               "us": round(s * 1e6, 2), "kv_tbps": round(keys * CELL_BYTES / s / 1e12, 3),
               "tflops": round(4 * keys * H * D / s / 1e12, 1), "same_bits": got.tobytes() == base.tobytes()}
        out.append(row)
        print(json.dumps(row), flush=True)
    layers.clear()
    cp.get_default_memory_pool().free_all_blocks()
    return out


def kernel_durations(ops, length: int) -> dict:
    """Each kernel's median duration (us) in the decode launch of one row at `length` (CUPTI via torch)."""
    from bench.gpu_profile import kernel_times

    layers, tables = cache(ops, 1, length, 1)
    q = cp.asarray(np.random.default_rng(0).standard_normal((1, H, D), np.float32))
    rows = PagedRows(cp.asarray(np.array([length - 1], np.int32)), cp.asarray(np.zeros(1, np.int32)), tables, None)
    ops.attention(q, layers[0], rows, D**-0.5)
    cp.cuda.Device().synchronize()
    runs = kernel_times(lambda: ops.attention(q, layers[0], rows, D**-0.5), 20)
    names = [k[0] for k in runs[0]]
    return {"length": length, "kernels": {n: round(float(np.median([r[i][2] for r in runs])), 2)
                                          for i, n in enumerate(names)}}


def once(ops) -> None:
    """One decode launch and one 512-row prefill launch at 30000 keys, for a profiler (ncu) to read."""
    length = 30000
    layers, tables = cache(ops, 1, length, 1)
    rng = np.random.default_rng(0)
    for positions in ([length - 1], np.arange(length - 512, length)):
        q = cp.asarray(rng.standard_normal((len(positions), H, D), np.float32))
        rows = PagedRows(cp.asarray(np.asarray(positions, np.int32)), cp.asarray(np.zeros(len(positions), np.int32)),
                         tables, None)
        ops.attention(q, layers[0], rows, D**-0.5)
    cp.cuda.Device().synchronize()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/attn-sweep.json")
    ap.add_argument("--once", action="store_true", help="only one decode and one prefill launch (for ncu)")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    if args.once:
        once(ops)
        return 0
    cells = []
    for length in (8192, 30000):
        cells += run_cell(ops, f"decode-1-at-{length}", [length - 1], [0], length, DECODE_PLANS)
    for chats in (16, 24):
        cells += run_cell(ops, f"decode-{chats}-at-4096", [4095] * chats, list(range(chats)), 4096, DECODE_PLANS)
    for length in (8192, 30000):
        pos = np.arange(length - 512, length)
        cells += run_cell(ops, f"prefill-512-at-{length}", pos, np.zeros(512, int), length, [{}, {"MMA_EX2": 0}])
    result = {"shape": [H, HKV, D, "f16"], "cells": cells}
    try:
        result["kernel_us"] = [kernel_durations(ops, n) for n in (8192, 30000)]
        print(json.dumps(result["kernel_us"]), flush=True)
    except Exception as e:  # the timings above stand without the profiler
        result["kernel_us_error"] = f"{type(e).__name__}: {e}"[:300]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
