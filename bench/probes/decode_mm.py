"""Probe: what bounds the streaming matmul (mm_tc) at 1 and 16 rows on the 8B shapes.

Builds of matmul.cu that differ only in how the weights and activations reach the MMAs:
  base        the product kernel (weights U chunks at a time into registers)
  xonce       timing only, wrong bits: every chunk reuses its slice's first activations (no L2 traffic)
  xhalf       timing only, wrong bits: 16 of an activation's 32 bytes loaded (what 16-bit ones would cost)
  tm1         one token tile (8 rows) a block whatever the batch (same bits; at one row the kernel
              before mm_*_one)
  x16         at 9-16 rows the product's mm_*_tm2h: activations rounded to 16 bits beforehand (as
              rms_norm_16 gives them), one 16-byte load per token tile and chunk (same bits). Run with
              their own patches before mm_*_tm2h (batch-loads-mm-h200.json): `nobatch` (each chunk's
              activation loads placed by the compiler: 8 rows gate|up 69.2 us against 60.1)
  m72         72 registers for the 9-16-row kernel (__maxnreg__) instead of 64
  u3, u4      3 or 4 chunks a batch at 2-16 rows
  rRuU        R row tiles a warp (a block covers 16 R weight rows), so each chunk's activations feed
              R tiles' MMAs; U chunks a batch (same bits), at 1-16 rows
  wtile       weights laid out tile by tile (each 16-row x 32-k chunk 1 KB contiguous; same bits)
  uUbT        the 9-16-row kernel (tm2) with U chunks a batch, bounded for T-thread blocks (same bits;
              fails to launch on larger blocks). tm2-batches-h200.json, 16 rows: q|k|v 19.1 us, 18.1
              at U 2 bounded for 256 (no spill), 19.7 / 20.2 at U 3 / 4; gate|up 72.5, 79.8 at U 3
              bounded for 64 (72 registers, one wave), ~110 at 80 registers (1.13 waves)
Builds measured once and removed with their kernel code (bench/results/prefetch-mm-h200.json): weights
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
from bench.gpu_ops import ROTATE_BYTES, random_weight, timed  # noqa: E402
from kernels.cuda import modules, plan  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.ops import CudaOps, mm_tc_args  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
PATCHES = {
    "xonce": [("const int k0 = c * 32 + 8 * t;", "const int k0 = c_begin * 32 + 8 * t;")],
    "xhalf": [("hi = ok ? p[1] : zero;", "hi = lo;")],
}
# activations given already rounded to 16 bits (act_to_16's layout, not permuted): the pairs pack_act
# makes, one 16-byte load per token tile and chunk (same bits)
# 72 registers for the 9-16-row kernel (and 64 for the 8-row one) instead of the 1024-thread bound (64):
# blocks of more than 256 threads then run fewer a SM
PATCHES["m72"] = [("__launch_bounds__(1024 / (TM * RT > 2 ? TM * RT / 2 : 1))",
                   "__maxnreg__(TM == 2 ? 72 : (TM == 1 ? 64 : 128))")]
for _u in (3, 4):  # chunks a batch of the 1-8 and 9-16-row kernels
    PATCHES[f"u{_u}"] = [("MM_TC(mm_##T##_tm1, WT, 1, 2, 0, 1)", f"MM_TC(mm_##T##_tm1, WT, 1, {_u}, 0, 1)"),
                         ("MM_TC(mm_##T##_tm2, WT, 2, 2, 0, 1)", f"MM_TC(mm_##T##_tm2, WT, 2, {_u}, 0, 1)")]
# weights stored tile by tile: each (16-row tile, 32-k chunk) 1 KB contiguous, chunks of a tile in order
# (the probe lays them out so; same bits), so a warp's batch is one contiguous run of U KB
PATCHES["wtile"] = [
    ("h + row_a + c * 32 + 8 * t)", "h + ((i64)((n0 >> 4) + r) * C + c) * 512 + g * 32 + 8 * t)"),
    ("h + row_b + c * 32 + 8 * t)", "h + ((i64)((n0 >> 4) + r) * C + c) * 512 + (g + 8) * 32 + 8 * t)"),
]
# the token-tile pair kernel (9-16 rows) with U chunks a batch under a register bound of its own
_MM_TC = "    extern \"C\" __global__ void __launch_bounds__(1024 / (TM * RT > 2 ? TM * RT / 2 : 1)) NAME("
for name, (u, threads, blocks) in {"u2b256": (2, 256, 3), "u3b256": (3, 256, 3), "u4b256": (4, 256, 3),
                                   "u3b64": (3, 64, 14)}.items():
    PATCHES[name] = [(_MM_TC, _MM_TC.replace("1024 / (TM * RT > 2 ? TM * RT / 2 : 1)",
                                             f"TM == 2 ? {threads} : 1024 / (TM * RT > 2 ? TM * RT / 2 : 1), "
                                             f"TM == 2 ? {blocks} : 1")),
                     ("MM_TC(mm_##T##_tm2, WT, 2, 2, 0, 1)", f"MM_TC(mm_##T##_tm2, WT, 2, {u}, 0, 1)")]


def _rt(variant: str) -> tuple[int, int] | None:
    """(R, U) of an `rRuU` build: R row tiles a warp sharing each chunk's activations (same bits), U
    chunks a batch, as kernels mm_f16_tm1r and mm_f16_tm2r bounded for 512-thread blocks (the 8B
    shapes' splits are <= 16)."""
    for part in variant.split("+"):
        if len(part) == 4 and part[0] == "r" and part[2] == "u":
            return int(part[1]), int(part[3])
    return None


def _rt_kernels(text: str, r: int, u: int) -> str:
    start = text.index("#define MM_TC(")
    macro = text[start:text.index("\n\n", start)]
    macro = macro.replace("#define MM_TC(", "#define MM_TCB(").replace("1024 / (TM * RT > 2 ? TM * RT / 2 : 1)", "512")
    return (text + "\n" + macro + "\n" + f"MM_TCB(mm_f16_tm1r, WT_F16, 1, {u}, 0, {r})\n"
            f"MM_TCB(mm_f16_tm2r, WT_F16, 2, {u}, 0, {r})\n")


@functools.cache
def build(variant: str):
    text = modules.source("matmul.cu")
    for part in variant.split("+"):
        for old, new in PATCHES.get(part, []):
            assert old in text, part
            text = text.replace(old, new)
    if _rt(variant):
        text = _rt_kernels(text, *_rt(variant))
    return cp.RawModule(code=text, options=modules.OPTIONS)


def run(variant: str, name: str, m: int, sm: int) -> dict:
    n, k = SHAPES[name]
    mod = build(variant)
    mm = plan.matmul_launch("f16", m, n, k, sm)
    if "tm1" in variant.split("+"):  # one token tile a block however many rows (same bits)
        mm = replace(mm, kernel="mm_f16_tm1", token_tiles=1,
                     grid=(mm.grid[0], plan.ceil_div(m, 8), 1), shared=plan.combine_bytes(mm.split, 1))
    if _rt(variant) and mm.token_tiles <= 2:
        r = _rt(variant)[0]
        mm = replace(mm, kernel=f"mm_f16_tm{mm.token_tiles}r", grid=(plan.ceil_div(n, 16 * r),) + mm.grid[1:],
                     shared=mm.shared * r)
    shared = mm.shared
    fn = mod.get_function(mm.kernel)
    w0 = random_weight(n, k, "f16")
    ws = [w0] + [random_weight(n, k, "f16") for _ in range(max(1, min(16, ROTATE_BYTES // w0.nbytes)) - 1)]
    if "wtile" in variant.split("+"):
        ws = [replace(w, data=w.data.reshape(-1, 16, w.data.shape[1] // 32, 32).transpose(0, 2, 1, 3).copy()
                      .reshape(w.data.shape)) for w in ws]
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
                elif not {"xonce", "xhalf"} & set(v.split("+")) and ref is not None:
                    r["same_bits"] = out.get().tobytes() == ref
                rows.append(r)
                print(f"{name:8s} m={m:2d} {v:14s} {r['us']:8.1f} us {r['GBps']:7.0f} GB/s"
                      f" {r.get('same_bits', '')}", flush=True)
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
