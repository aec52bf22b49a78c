"""Probe: what bounds the streaming matmul (mm_tc) at 1 and 16 rows on the 8B shapes.

Builds of matmul.cu that differ only in how the weights and activations reach the MMAs:
  base        the product kernel (weights U chunks at a time into registers)
  xonce       timing only, wrong bits: every chunk reuses its slice's first activations (no L2 traffic)
  xhalf       timing only, wrong bits: 16 of an activation's 32 bytes loaded (what 16-bit ones would cost)
  tm1         one token tile (8 rows) a block whatever the batch (same bits; at one row the kernel
              before mm_*_one)
  x16         at 9-16 rows the product's mm_*_tm2h: activations rounded to 16 bits beforehand (as
              rms_norm_16 writes them), one 16-byte load per token tile and chunk (same bits)
  nat         timing only (other bits): the k sets a shared-memory wgmma operand in mm_tc's layout
              would need (k 0-15, then 16-31 of each chunk), two 8-byte loads a row; 9-12 % slower
              at one row (natural-kset-mm-h200.json)
  m72         72 registers for the 9-16-row kernel (__maxnreg__) instead of 64
  u3, u4      3 or 4 chunks a batch at 2-16 rows
  uUbT        the 9-16-row kernel (tm2) with U chunks a batch, bounded for T-thread blocks (same bits;
              fails to launch on larger blocks). tm2-batches-h200.json, 16 rows: q|k|v 19.1 us, 18.1
              at U 2 bounded for 256 (no spill), 19.7 / 20.2 at U 3 / 4; gate|up 72.5, 79.8 at U 3
              bounded for 64 (72 registers, one wave), ~110 at 80 registers (1.13 waves)
Builds measured once and removed (NOTES "Session 10", git history of this file): R row tiles a warp
sharing each chunk's activations (`rRuU`, rt-mm-h200.json), weights stored tile by tile (`wtile`,
wtile-mm-h200.json), each chunk's activation loads left where the compiler put them (`nobatch`,
batch-loads-mm-h200.json: 8 rows gate|up 69.2 us against 60.1). Builds measured once and removed with their kernel code (prefetch-mm-h200.json): weights
asked into L2 one to four batches ahead (`pfD`, bulk or per line; slower everywhere), one token tile
with four chunks a batch each loading after the chunk before (the tm1 of 56c1bd4, now two a batch).
Builds measured once and removed (git history): weights staged ahead in shared memory by cp.async
(`ring{R}`, MM_RING in matmul.cu of d31d409), token tiles fastest in the grid (`fast`, 628915c).
Prints and writes JSON: microseconds per matmul (median of graph replays over weight copies past
L2) and whether each same-bits build matched `base` bit for bit.
  python3 bench/probes/decode_mm.py --out results.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import ROTATE_BYTES, patched_module, random_weight, timed  # noqa: E402
from kernels.cuda import plan  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.ops import CudaOps, mm_tc_args  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
PATCHES = {
    "xonce": [("ldx, c * 32 + 8 * t, vec, xv[tm]", "ldx, c_begin * 32 + 8 * t, vec, xv[tm]"),
              ("ldx, (c0 + u) * 32 + 8 * t, true, xv[u][tm]", "ldx, c_begin * 32 + 8 * t, true, xv[u][tm]")],
    "xhalf": [("hi = ok ? p[1] : zero;", "hi = lo;")],
}
# activations given already rounded to 16 bits (act_to_16's layout, not permuted): the pairs pack_act
# makes, one 16-byte load per token tile and chunk (same bits)
# 72 registers for the 9-16-row kernel (and 64 for the 8-row one) instead of the 1024-thread bound (64):
# blocks of more than 256 threads then run fewer a SM
PATCHES["m72"] = [("__launch_bounds__(1024 / (TM > 2 ? TM / 2 : 1))",
                   "__maxnreg__(TM == 2 ? 72 : (TM == 1 ? 64 : 128))")]
# the natural k sets a 16-bit weights' shared-memory wgmma operand gives (k 0-15 then 16-31 of each
# chunk): lane t takes k 4t .. 4t+3 and 16+4t .. 16+4t+3, two 8-byte loads a row, the same sectors
# (different bits from base; timing the decode cost of that layout)
_LD2 = ("__device__ __forceinline__ uint4 ld_pair8(const u16* p) {\n"
        "    const uint2 lo = *reinterpret_cast<const uint2*>(p), hi = *reinterpret_cast<const uint2*>(p + 16);\n"
        "    return make_uint4(lo.x, lo.y, hi.x, hi.y);\n}\n")
PATCHES["nat"] = [
    ("// A token's 8 activations", _LD2 + "// A token's 8 activations"),
    ("lo = ok ? p[0] : zero, hi = ok ? p[1] : zero;", "lo = ok ? p[0] : zero, hi = ok ? p[4] : zero;"),
    ("ldx, c * 32 + 8 * t, vec, xv[tm]", "ldx, c * 32 + 4 * t, vec, xv[tm]"),
    ("ldx, (c0 + u) * 32 + 8 * t, true, xv[u][tm]", "ldx, (c0 + u) * 32 + 4 * t, true, xv[u][tm]"),
    ("wa[u] = *reinterpret_cast<const uint4*>(h + row_a + c * 32 + 8 * t);", "wa[u] = ld_pair8(h + row_a + c * 32 + 4 * t);"),
    ("wb[u] = *reinterpret_cast<const uint4*>(h + row_b + c * 32 + 8 * t);", "wb[u] = ld_pair8(h + row_b + c * 32 + 4 * t);"),
    ("*reinterpret_cast<const uint4*>(x16 + (i64)m * ldx + (c0 + u) * 32 + 8 * t)", "ld_pair8(x16 + (i64)m * ldx + (c0 + u) * 32 + 4 * t)"),
    ("const int src = u * 8 + 2 * t;", "const int src = u * 8 + t;"),
    ("__shfl_sync(0xffffffffu, p0, src + 1), __shfl_sync(0xffffffffu, p1, src + 1)",
     "__shfl_sync(0xffffffffu, p0, src + 4), __shfl_sync(0xffffffffu, p1, src + 4)"),
]
for _u in (3, 4):  # chunks a batch of the 1-8 and 9-16-row kernels
    PATCHES[f"u{_u}"] = [("MM_TC(mm_##T##_tm1, WT, 1, 2, 0)", f"MM_TC(mm_##T##_tm1, WT, 1, {_u}, 0)"),
                         ("MM_TC(mm_##T##_tm2, WT, 2, 2, 0)", f"MM_TC(mm_##T##_tm2, WT, 2, {_u}, 0)")]
# the token-tile pair kernel (9-16 rows) with U chunks a batch under a register bound of its own
_MM_TC = "    extern \"C\" __global__ void __launch_bounds__(1024 / (TM > 2 ? TM / 2 : 1)) NAME("
for name, (u, threads, blocks) in {"u2b256": (2, 256, 3), "u3b256": (3, 256, 3), "u4b256": (4, 256, 3),
                                   "u3b64": (3, 64, 14)}.items():
    PATCHES[name] = [(_MM_TC, _MM_TC.replace("1024 / (TM > 2 ? TM / 2 : 1)",
                                             f"TM == 2 ? {threads} : 1024 / (TM > 2 ? TM / 2 : 1), "
                                             f"TM == 2 ? {blocks} : 1")),
                     ("MM_TC(mm_##T##_tm2, WT, 2, 2, 0)", f"MM_TC(mm_##T##_tm2, WT, 2, {u}, 0)")]



@functools.cache
def build(variant: str):
    return patched_module("matmul.cu", variant, PATCHES)


def run(variant: str, name: str, m: int, sm: int) -> dict:
    n, k = SHAPES[name]
    mod = build(variant)
    mm = plan.matmul_launch("f16", m, n, k, sm)
    if "tm1" in variant.split("+"):  # one token tile a block however many rows (same bits)
        mm = replace(mm, kernel="mm_f16_tm1", token_tiles=1,
                     grid=(mm.grid[0], plan.ceil_div(m, 8), 1), shared=plan.combine_bytes(mm.split, 1))
    shared = mm.shared
    fn = mod.get_function(mm.kernel)
    w0 = random_weight(n, k, "f16")
    ws = [w0] + [random_weight(n, k, "f16") for _ in range(max(1, min(16, ROTATE_BYTES // w0.nbytes)) - 1)]
    x = cp.random.standard_normal((m, k), dtype=cp.float32)
    if "x16" in variant.split("+") and mm.token_tiles == 2:
        mm = plan.matmul_launch("f16", m, n, k, sm, prologue="x16")
        fn = mod.get_function(mm.kernel)
        x = CudaOps._act16(x, int(w0.data.shape[1]), False)
    out = cp.zeros((m, n), cp.float32)

    def args(w):
        return mm_tc_args(w, x, out, out)

    def go():
        for w in ws:
            launch(fn, mm.grid, mm.block, args(w), shared)

    t = timed(go) / len(ws)
    launch(fn, mm.grid, mm.block, args(ws[0]), shared)
    cp.cuda.Device().synchronize()
    return {"variant": variant, "shape": name, "m": m, "split": mm.split, "shared": shared, "us": t * 1e6,
            "GBps": w0.nbytes / t / 1e9, "out": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="base,tm1,xonce")
    ap.add_argument("--rows", default="1,8,16,32")
    a = ap.parse_args()
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for name in SHAPES:
        for m in (int(r) for r in a.rows.split(",")):
            cp.random.seed(0)
            ref = None
            for v in a.variants.split(","):
                try:
                    cp.random.seed(0)
                    r = run(v, name, m, sm)
                except Exception as e:  # keep probing the other builds
                    rows.append({"variant": v, "shape": name, "m": m, "error": str(e)[:300]})
                    print(v, name, m, "FAILED", e, flush=True)
                    continue
                out = r.pop("out")
                if v == "base":
                    ref = out.get().tobytes()
                elif not {"xonce", "xhalf", "nat"} & set(v.split("+")) and ref is not None:
                    r["same_bits"] = out.get().tobytes() == ref
                rows.append(r)
                print(f"{name:8s} m={m:2d} {v:14s} {r['us']:8.1f} us {r['GBps']:7.0f} GB/s"
                      f" {r.get('same_bits', '')}", flush=True)
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
