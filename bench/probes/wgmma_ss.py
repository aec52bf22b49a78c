"""Probe: the exact prefill matmul with the weights as wgmma's shared-memory A operand (NOTES "Next").

mm_wgmma_tma feeds the weights from registers: every chunk two LDS.128 of fragments, then two MMAs.
This build (`ss`, a text patch of wgmma.cu) gives the MMA a descriptor of the weights' stage
instead. For the same bits each instruction must still take mm_tc's k set ({0-3, 8-11, 16-19,
24-27}, then the rest; only the set fixes the bits, wgmma-bits-h200.json), so both operands are
stored with each 64-byte chunk of a row as its 8-byte pieces p0 p2 p4 p6 p1 p3 p5 p7 (p_i = k
4i .. 4i+3): bytes 0-31 are the first instruction's 16 k, 32-63 the second's. The weights come by
TMA with the 64-byte swizzle (a chunk row is 64 bytes), the tokens as before (128-byte swizzle).
Builds: rs (the product kernel), ss, and the feed-bound builds of PATCHES.
Prints and writes JSON: TFLOP/s at 512 rows on the 8B shapes, and whether ss gave rs's bits.
  python3 bench/probes/wgmma_ss.py --out results.json
Measured (H200, wgmma-ss-h200.json): ss 12-18 % faster with rs's bits, ss+d3 (since removed) no better. Not taken:
mm_tc would have to read the same layout, two 8-byte loads a row instead of one 16-byte load, and
that costs decode 9-12 % (decode_mm.py `nat`, natural-kset-mm-h200.json); gathering the pieces
into shared memory by cp.async instead was slower than rs (wgmma-feed-h200.json, commit 4ccef02).
Since session 12's stage-at-a-time chunk loop, ss is only 4-7 % faster (wgmma-lean-h200.json). The
feed-bound builds (w0, x0, nw, nx, nwx, s1, nostore; wrong sums) show what the kernel waits for:
  python3 bench/probes/wgmma_ss.py --variants rs,nwx,s1,nostore --shapes o,down --out F
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import patched_module, random_weight, timed  # noqa: E402
from kernels.cuda import plan, tensor_map  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SWIZZLE_64B = 2  # CUtensorMapSwizzle
PIECES = [0, 2, 4, 6, 1, 3, 5, 7]  # 8-byte pieces of a 64-byte chunk, in storage order

_D = ", ".join(f"%{i}" for i in range(64))
_OUTS = ", ".join(f'"+f"(d[{i}])' for i in range(64))
SS_HELPERS = r'''
// K-major A from shared memory, 64-byte swizzle: a row's chunk is 64 bytes, 8-row groups 512 apart.
__device__ __forceinline__ unsigned long long smem_desc_a64(unsigned addr) {
    return (unsigned long long)((addr >> 4) & 0x3fff) | ((unsigned long long)((512 >> 4) & 0x3fff) << 32) | (2ull << 62);
}
#define WGMMA_SS(T) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {D}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
    : OUTS : "l"(da), "l"(db))
template <int BF16>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], unsigned long long da, unsigned long long db) {
    if constexpr (BF16) {
        WGMMA_SS("bf16");
    } else {
        WGMMA_SS("f16");
    }
}
'''.replace("{D}", "{" + _D + "}").replace("OUTS", _OUTS)
PATCHES = {
    "ss": [
        ("struct __align__(64) TensorMap {", SS_HELPERS + "\nstruct __align__(64) TensorMap {"),
        ('''        a0 = *reinterpret_cast<const uint4*>(ws + frag);
        a1 = *reinterpret_cast<const uint4*>(ws + frag + 8 * 64);
        const unsigned xs = base + s * X_STAGE + kc * 64;
        asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
        wgmma_ra<BF16>(part, a0.x, a1.x, a0.y, a1.y, smem_desc(xs));
        wgmma_ra<BF16>(part, a0.z, a1.z, a0.w, a1.w, smem_desc(xs + 32));''',
         '''        (void)ws; (void)a0; (void)a1;
        const unsigned wa = wbase + s * W_STAGE + kc * WG_ROWS * 64 + wg * 64 * 64;
        const unsigned xs = base + s * X_STAGE + kc * 64;
        asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
        wgmma_ss<BF16>(part, smem_desc_a64(wa), smem_desc(xs));
        wgmma_ss<BF16>(part, smem_desc_a64(wa + 32), smem_desc(xs + 32));'''),
    ],
    # what bounds the feed (timing only; wrong sums): all blocks copy weight tile 0 / token tile 0
    # (no DRAM stream), a stage without its weights' or tokens' copy, slices not drained, no stores
    "w0": [("(st * WG_KC + kc) * 32, n0, full", "(st * WG_KC + kc) * 32, 0, full")],
    "x0": [("st * WG_KC * 32, m0, full", "st * WG_KC * 32, 0, full")],
    "nw": [("mbar_expect(full + 8 * s, X_STAGE + W_STAGE);", "mbar_expect(full + 8 * s, X_STAGE);"),
           ("for (int kc = 0; kc < WG_KC; ++kc)\n                    tma_2d(", "for (int kc = 0; kc < 0; ++kc)\n                    tma_2d(")],
    "nx": [("mbar_expect(full + 8 * s, X_STAGE + W_STAGE);", "mbar_expect(full + 8 * s, W_STAGE);"),
           ("                tma_2d(base + s * X_STAGE", "                if (0) tma_2d(base + s * X_STAGE")],
    "nwx": [("mbar_expect(full + 8 * s, X_STAGE + W_STAGE);", "mbar_expect(full + 8 * s, 0);"),
            ("for (int kc = 0; kc < WG_KC; ++kc)\n                    tma_2d(", "for (int kc = 0; kc < 0; ++kc)\n                    tma_2d("),
            ("                tma_2d(base + s * X_STAGE", "                if (0) tma_2d(base + s * X_STAGE")],
    "s1": [("(unsigned)C, (unsigned)S);", "(unsigned)C, 1u);")],
    "nostore": [("    for (int q = 0; q < 4; ++q)\n        store_tiles", "    for (int q = 0; q < 4 * (flags == 77); ++q)\n        store_tiles")],
}


@functools.cache
def build(variant: str):
    return patched_module("wgmma.cu", variant, PATCHES)


def pieces(a):
    """A 16-bit [rows, Kp] array with each 64-byte chunk stored as PIECES."""
    rows, kp = a.shape
    return a.view(cp.uint64).reshape(rows, kp // 32, 8)[:, :, PIECES].reshape(rows, kp // 4).view(cp.uint16).copy()


def run(variant: str, name: str, m: int, sm: int) -> dict:
    n, k = SHAPES[name]
    w = random_weight(n, k, "f16")
    x = cp.random.standard_normal((m, k), dtype=cp.float32)
    kp = int(w.data.shape[1])
    ss = "ss" in variant.split("+")
    if ss:
        wdata, x16 = pieces(w.data), pieces(CudaOps._act16(x, kp, False))
        wmap = tensor_map.tiled_2d(wdata, (32, plan.WIDE_N), SWIZZLE_64B)
    else:
        wdata, x16 = w.data, CudaOps._act16(x, kp, False, perm=True)
        wmap = tensor_map.tiled_2d(wdata, (32, plan.WIDE_N), tensor_map.SWIZZLE_NONE)
    xmap = tensor_map.tiled_2d(x16, (64, plan.WIDE_M), tensor_map.SWIZZLE_128B)
    wg = plan.wgmma_launch("f16", m, n, k, sm)
    if plan.wgmma_rows(wg) != plan.WIDE_N:  # the patched builds keep the default 128-row tiles
        raise SystemExit(f"{name} at {m} rows takes 64-row tiles; this probe times 128-row ones")
    fn = build(variant).get_function(wg.kernel)
    fn.max_dynamic_shared_size_bytes = wg.shared
    out = cp.zeros((m, n), cp.float32)
    d = cp.zeros(4, cp.float32)

    def go():
        launch(fn, wg.grid, wg.block, (wmap, xmap, d, d, out, np.int32(m), np.int32(n), np.int32(kp), np.int32(0),
                                       np.int32(wg.split)), shared=wg.shared)

    t = timed(go)
    go()
    cp.cuda.Device().synchronize()
    return {"variant": variant, "shape": name, "m": m, "us": t * 1e6, "TFLOPs": 2 * m * n * k / t / 1e12,
            "out": out.get().tobytes()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="rs,ss")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args()
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for name in a.shapes.split(","):
        ref = None
        for v in a.variants.split(","):
            cp.random.seed(0)
            try:
                r = run(v, name, a.rows, sm)
            except Exception as e:  # keep probing the other builds
                rows.append({"variant": v, "shape": name, "error": str(e)[:300]})
                print(v, name, "FAILED", e, flush=True)
                continue
            out = r.pop("out")
            if v == "rs":
                ref = out
            elif ref is not None:
                r["same_bits"] = out == ref
            rows.append(r)
            print(f"{name:8s} {v:8s} {r['us']:8.1f} us {r['TFLOPs']:6.1f} TFLOP/s {r.get('same_bits', '')}", flush=True)
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
