"""One layer's decode attention (8B shape: 32 heads, 8 KV, 128, f16 cache) on attn_mma (and attn_merge):
"main" (the default build), "ring" (a sub-tile's K and V issued apart, two sub-tiles in flight: RING),
"merge_last" (the row's last block merges its chunks, no attn_merge launch: MERGE_LAST) and "ring_merge"
(both), "ring_merge_b2" (both, chunks over workers for two blocks an SM, not three: plan.MMA_BLOCKS_PER_SM);
rows each their own sequence, bits compared with main's; ms a call the median of three 20-call
runs, each call on other pages than the last (at least ~200 MB of KV between two reads of a page, as a
step's 32 layers give, so L2 holds none), queued behind a spinning kernel so that the GPU's time is
measured, not Python's.

    python3 bench/probes/attn_decode_ab.py --out /tmp/attn-decode-ab.json      # on a GPU machine
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import back_to_back_ms, write_json  # noqa: E402
from kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from kernels.cuda import plan  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

H, HKV, D = 32, 8, 128
PAGE_BYTES = PAGE_SIZE * HKV * D * 2 * 2  # K and V
POOL = 2400  # pages (~2.5 GB)
# ~20 ms of spinning before each run: a call's host side (~0.1 ms) is longer than a layer's decode attention
HOLD_CYCLES = 40_000_000
VARIANTS = {"main": (False, False, 3), "ring": (True, False, 3), "merge_last": (False, True, 3),
            "ring_merge": (True, True, 3), "ring_merge_b2": (True, True, 2)}  # (RING, MERGE_LAST, blocks an SM)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="1x30000,16x4096,1x8192,1x4096,16x30000")
    ap.add_argument("--out", default="/tmp/attn-decode-ab.json")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    layer = ops.kv_alloc(POOL, HKV, D, "f16")
    for a in (layer.k, layer.v):
        a[...] = cp.random.default_rng(0).standard_normal(a.shape, dtype=cp.float32).astype(cp.float16).view(a.dtype)
    rng = np.random.default_rng(0)
    cells = []
    for spec in args.cells.split(","):
        t, ctx = (int(x) for x in spec.split("x"))
        pages = -(-ctx // PAGE_SIZE)
        copies = max(1, min(POOL // (t * pages), -(-200 * 2**20 // (t * pages * PAGE_BYTES))))
        width = pages
        q = cp.asarray(rng.standard_normal((t, H, D), np.float32))
        pos = cp.full(t, ctx - 1, cp.int32)
        seq = cp.arange(t, dtype=cp.int32)
        row_sets = []
        for c in range(copies):  # copy c: row r on pages (c * t + r) * pages ..
            tables = (np.arange(t * pages, dtype=np.int32).reshape(t, pages) + c * t * pages) % POOL
            row_sets.append(PagedRows(pos, seq, cp.asarray(tables), None))
        kv_bytes = t * ctx * HKV * D * 2 * 2
        at = plan.mma_attention_launch(t, H, HKV, D, width, ops.sm_count)
        cell: dict = {"rows": t, "keys": ctx, "copies": copies, "kv_mb": round(kv_bytes / 2**20, 1),
                      "shared": at.shared, "min_blocks": at.min_blocks, "bound_us": round(kv_bytes / 4.28e12 * 1e6, 1)}
        outs = {}
        saved = plan.MMA_BLOCKS_PER_SM
        for name, (ring, merge_last, blocks) in VARIANTS.items():
            ops.attention_ring, ops.attention_merge_last = ring, merge_last
            plan.MMA_BLOCKS_PER_SM = blocks
            workers = plan.mma_attention_launch(t, H, HKV, D, width, ops.sm_count).workers
            turn = [0]

            def call(turn=turn, row_sets=row_sets, q=q):
                rows = row_sets[turn[0] % len(row_sets)]
                turn[0] += 1
                return ops.attention(q, layer, rows, D**-0.5)

            try:
                runs = sorted(back_to_back_ms(call, 20, HOLD_CYCLES) for _ in range(3))
                outs[name] = [cp.asnumpy(ops.attention(q, layer, rs, D**-0.5)) for rs in row_sets[:2]]
                counters_zero = int(ops._attn_counters.sum()) == 0
            except Exception as e:  # a failing build is a result too
                cell[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                continue
            finally:
                plan.MMA_BLOCKS_PER_SM = saved
            ms = runs[1]
            cell[name] = {"workers": workers, "ms": round(ms, 4), "ms_runs": [round(r, 4) for r in runs],
                          "kv_tb_s": round(kv_bytes / ms / 1e9, 3), "counters_zero": counters_zero}
        ops.attention_ring, ops.attention_merge_last = False, False
        for name in VARIANTS:
            if name != "main" and "main" in outs and name in outs:
                a, b = np.stack(outs["main"]), np.stack(outs[name])
                cell[name]["same_bits_as_main"] = a.tobytes() == b.tobytes()
                cell[name]["values_differing"] = int((a.view(np.uint32) != b.view(np.uint32)).sum())
                cell[name]["finite"] = bool(np.isfinite(b).all())
                cell[name]["over_main_ms"] = round(cell[name]["ms"] / cell["main"]["ms"], 3)
        cells.append(cell)
        print(spec, {k: (v.get("ms"), v.get("same_bits_as_main"), v.get("error")) for k, v in cell.items()
                     if isinstance(v, dict)}, flush=True)
        write_json(args.out, {"shape": [H, HKV, D, "f16"], "bound_tb_s": 4.28, "cells": cells})
    return 0


if __name__ == "__main__":
    sys.exit(main())
