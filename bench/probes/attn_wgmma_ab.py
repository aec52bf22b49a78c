"""One layer's prefill attention (8B shape: 32 heads, 8 KV, 128, f16 cache): attn_mma against
attention_wgmma.cu as planned, with one or two warpgroups a block (plan.WGMMA_ATTN_FILL forced) and
warp-specialised (attention_ws.cu, --ws: as planned and with its knobs set, SETS), 512 rows ending at each
context length, bits compared with attn_mma's; each variant's ms the median of three 20-call runs.

    python3 bench/probes/attn_wgmma_ab.py --out /tmp/attn-wgmma.json      # on an sm_90 GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import back_to_back_ms, write_json  # noqa: E402
from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

H, HKV, D, ROWS = 32, 8, 128, 512
VARIANTS = {"mma": None, "wgmma": plan.WGMMA_ATTN_FILL, "wgmma_1wg": 1e9, "wgmma_2wg": 0.0}
# --ws: attention_ws.cu beside, as planned ("ws") and with its knobs (plan.WGMMA_WS_*) set: the position
# compares skipped (MK), the lean build (LN), its weights by ex2.approx.ftz (FZ), the folded O as float2s
# (VF: all four "ws_lean", LOCKSTEP_ATTN_WS_LEAN=1's build), with the softmax overlap (OV), without the
# ping-pong (PP), with its K/V by TMA (TK)
WS = {"mma": None, "ws": plan.WGMMA_ATTN_FILL, "ws_mk": plan.WGMMA_ATTN_FILL, "ws_ln": plan.WGMMA_ATTN_FILL,
      "ws_lnfz": plan.WGMMA_ATTN_FILL, "ws_lean": plan.WGMMA_ATTN_FILL, "ws_lean_ov": plan.WGMMA_ATTN_FILL,
      "ws_lean_pp0": plan.WGMMA_ATTN_FILL, "wgmma": plan.WGMMA_ATTN_FILL, "ws_lean_tma": plan.WGMMA_ATTN_FILL}
ASKED_ONLY = {"ws_lean_tma"}  # run when --variants names them (K/V by TMA: its own process, in case it hangs)
KNOBS = ("WGMMA_WS_PINGPONG", "WGMMA_WS_OVERLAP", "WGMMA_WS_SKIP_MASK", "WGMMA_WS_LEAN", "WGMMA_WS_FTZ",
         "WGMMA_WS_VEC_FOLD", "WGMMA_WS_TMA")
_OFF = {"WGMMA_WS_OVERLAP": False, "WGMMA_WS_SKIP_MASK": True, "WGMMA_WS_LEAN": False, "WGMMA_WS_FTZ": False,
        "WGMMA_WS_VEC_FOLD": False, "WGMMA_WS_TMA": False}
SETS = {"ws_mk": _OFF, "ws_ln": {**_OFF, "WGMMA_WS_LEAN": True},
        "ws_lnfz": {**_OFF, "WGMMA_WS_LEAN": True, "WGMMA_WS_FTZ": True},
        "ws_lean": {**_OFF, "WGMMA_WS_LEAN": True, "WGMMA_WS_FTZ": True, "WGMMA_WS_VEC_FOLD": True},
        "ws_lean_ov": {**_OFF, "WGMMA_WS_LEAN": True, "WGMMA_WS_FTZ": True, "WGMMA_WS_VEC_FOLD": True,
                       "WGMMA_WS_OVERLAP": True},
        "ws_lean_pp0": {**_OFF, "WGMMA_WS_LEAN": True, "WGMMA_WS_FTZ": True, "WGMMA_WS_VEC_FOLD": True,
                        "WGMMA_WS_PINGPONG": False},
        "ws_lean_tma": {**_OFF, "WGMMA_WS_LEAN": True, "WGMMA_WS_FTZ": True, "WGMMA_WS_VEC_FOLD": True,
                        "WGMMA_WS_TMA": True}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="2048,8192,30000")
    ap.add_argument("--out", default="/tmp/attn-wgmma.json")
    ap.add_argument("--ws", action="store_true", help="attn_mma, attention_ws.cu and attention_wgmma.cu as planned")
    ap.add_argument("--variants", default="", help="with --ws: these of WS only (comma-separated; mma always)")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    contexts = [int(x) for x in args.contexts.split(",")]
    width = -(-max(contexts) // PAGE_SIZE)
    layer = ops.kv_alloc(width, HKV, D, "f16")
    for a in (layer.k, layer.v):
        a[...] = cp.random.default_rng(0).standard_normal(a.shape, dtype=cp.float32).astype(cp.float16).view(a.dtype)
    tables = cp.asarray(np.arange(width, dtype=np.int32)[None])
    rng = np.random.default_rng(0)
    cells = []
    for ctx in contexts:
        pos = np.arange(ctx - ROWS, ctx, dtype=np.int32)
        rows = PagedRows(cp.asarray(pos), cp.zeros(ROWS, cp.int32), tables, None)
        q = cp.asarray(rng.standard_normal((ROWS, H, D), np.float32))
        flops = 4 * H * D * float((pos.astype(np.int64) + 1).sum())
        cell: dict = {"context": ctx, "rows": ROWS}
        outs = {}
        chosen = {v for v in args.variants.split(",") if v} | {"mma"}
        table = ({k: v for k, v in WS.items() if k in chosen or (len(chosen) == 1 and k not in ASKED_ONLY)}
                 if args.ws else VARIANTS)
        for name, fill in table.items():
            ops.wgmma_attention = fill is not None
            ops.attention_ws = name.startswith("ws")
            saved = plan.WGMMA_ATTN_FILL
            knobs = {k: getattr(plan, k) for k in KNOBS}
            for k, v in SETS.get(name, {}).items():
                setattr(plan, k, v)
            ops.attention_ws_tma = plan.WGMMA_WS_TMA  # the ops' switch, not the plan, picks the build
            plan.WGMMA_ATTN_FILL = fill if fill is not None else saved
            try:
                build = ops.attention_build(ROWS, H, HKV, D, width)
                wt = (plan.wgmma_attention_launch(ROWS, H, HKV, D, width, ops.sm_count, ws=ops.attention_ws)
                      if fill is not None else None)
                runs = sorted(back_to_back_ms(lambda q=q, rows=rows: ops.attention(q, layer, rows, D**-0.5), 20)
                              for _ in range(3))
                ms = runs[1]  # the median of three
                outs[name] = cp.asnumpy(ops.attention(q, layer, rows, D**-0.5))
            except Exception as e:  # a failing build is a result too: the others still run
                cell[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                continue
            finally:
                plan.WGMMA_ATTN_FILL = saved
                for k, v in knobs.items():
                    setattr(plan, k, v)
                ops.wgmma_attention = False
            cell[name] = {"build": build + ("+ws" if wt and wt.ws else ""), "groups": wt.groups if wt else None,
                          "stages": wt.stages if wt else None,
                          "ms": round(ms, 4), "ms_runs": [round(r, 4) for r in runs], "tflops": round(flops / ms / 1e9, 1)}
            if name != "mma" and "mma" in outs:
                a, b = outs[name], outs["mma"]
                cell[name]["same_bits_as_mma"] = a.tobytes() == b.tobytes()
                cell[name]["values_differing"] = int((a.view(np.uint32) != b.view(np.uint32)).sum())
                cell[name]["max_abs_diff"] = float(np.abs(a - b).max())
                cell[name]["finite"] = bool(np.isfinite(a).all())
        cells.append(cell)
        print(cell, flush=True)
        write_json(args.out, {"shape": [H, HKV, D, "f16"], "cells": cells})
    return 0


if __name__ == "__main__":
    sys.exit(main())
