"""Probe: builds of the exact prefill matmul (wgmma.cu) at 512 rows on the 8B shapes.

  base       the product kernel
  drain      every slice waits for all its MMAs before the next starts (the kernel before two
             accumulators took the slices in turn; same bits)
  st5        five pipeline stages instead of four (same bits)
Prints and writes JSON: microseconds and TFLOP/s per build and shape, and whether each build gave
the product's bits.
  python3 bench/probes/wgmma_variants.py --variants base,drain,st5 --out results.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import patched_module, random_weight, timed  # noqa: E402
from kernels.cuda import plan, tensor_map  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
PATCHES = {
    "drain": [("    chunk(c++, acc, a[0]);\n",
               '    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");\n    chunk(c++, acc, a[0]);\n')],
    "st5": [("#define WG_STAGES 4 ", "#define WG_STAGES 5 ")],
}


@functools.cache
def build(variant: str):
    return patched_module("wgmma.cu", variant, PATCHES)


def run(variant: str, name: str, m: int, sm: int) -> dict:
    n, k = SHAPES[name]
    w = random_weight(n, k, "f16")
    kp = int(w.data.shape[1])
    x16 = CudaOps._act16(cp.random.standard_normal((m, k), dtype=cp.float32), kp, False, perm=True)
    wmap = tensor_map.tiled_2d(w.data, (32, plan.WIDE_N), tensor_map.SWIZZLE_NONE)
    xmap = tensor_map.tiled_2d(x16, (64, plan.WIDE_M), tensor_map.SWIZZLE_128B)
    stages = 5 if "st5" in variant.split("+") else plan.WGMMA_STAGES
    wg = plan.wgmma_launch("f16", m, n, k, sm)
    wg = replace(wg, shared=wg.shared + (stages - plan.WGMMA_STAGES) * (2 * (plan.WIDE_N + plan.WIDE_M) * 64 + 16))
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
    ap.add_argument("--variants", default="base,drain,st5")
    ap.add_argument("--rows", type=int, default=512)
    a = ap.parse_args()
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for name in SHAPES:
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
            if ref is None:
                ref = out
            else:
                r["same_bits"] = out == ref
            rows.append(r)
            print(f"{name:8s} {v:12s} {r['us']:8.1f} us {r['TFLOPs']:6.1f} TFLOP/s {r.get('same_bits', '')}", flush=True)
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
