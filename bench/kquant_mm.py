"""Matmuls of Q4_K / Q6_K blocks (matmul.cu's f16 MMAs and kquant_mm.cu's integer kernels) against f16,
the 8B shapes (H200): microseconds, weight GB/s and the fraction of the copy bandwidth. Writes JSON (--out), prints a table.

    python3 bench/kquant_mm.py --out /tmp/kquant-mm.json
    python3 bench/kquant_mm.py --probe --out /tmp/kquant-probe.json   # one row: builds x splits, bits vs the default build
    python3 bench/kquant_mm.py --probe --x16 --out /tmp/kquant-x16.json   # the same for the 16-row kernel's builds
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_ops import (  # noqa: E402
    SHAPES_8B,
    bench_matmul,
    copy_bandwidth,
    guarded,
    probe_activations,
    random_weight,
    timed,
)
from lockstep_kernels.cuda import launch as kernel_launch  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps, mm_tc_args, streaming_kernel  # noqa: E402
from lockstep_kernels.cuda.weights import CudaWeight  # noqa: E402

# Builds of the one-row kernel (matmul.cu's defines): the default (chunks a batch KQ_U_ONE 4, register caps
# KQ_REGS_ONE 72 for Q4_K, KQ6_REGS_ONE 80 for Q6_K, Q6_K's halves split in the activations, its odd nibble
# pairs scaled in an FMA); a batch's chunk scales made once, by one lane each (KQ_LANE_SCALES; 2: Q6_K only,
# where with the other two it was faster in session 27's probe); the next
# batch's weights loaded before a batch's MMAs (KQ_ONE_PREFETCH; the caps it needs without spills).
# probe_oneh: the one-row kernel on 16-bit pairs (mm_*_oneh, plan.ONE_X16_TYPES) against float32 input,
# default and KQ_LANE_SCALES.
LANE_SCALES = (("KQ_LANE_SCALES", 1),)
ONE_PREFETCH = (("KQ_ONE_PREFETCH", 1), ("KQ_REGS_ONE", 96), ("KQ6_REGS_ONE", 104))
PROBE_BUILDS = [(), LANE_SCALES, (("KQ_LANE_SCALES", 2),), ONE_PREFETCH]
# The 9-16-row kernel (f16 activations): the default and the next batch's weights loaded before a batch's
# MMAs (KQ_X16_PREFETCH); then mm_*_tm2h2 (two row tiles a block) at 2 and 4 chunks a batch (KQ_U12_RT).
X16_BUILDS = [(), (("KQ_X16_PREFETCH", 1),)]
RT2_BUILDS = [(), (("KQ_U12_RT", 4),)]


def rows8_bits(ops: CudaOps, n: int, k: int, m: int, dtype: str) -> bool:
    """Whether mmq_*_tile4r8 (plan.KQ_TILE8) gives the 4-row-tile kernel's bits on one random weight and batch."""
    w, x = random_weight(n, k, dtype), cp.random.standard_normal((m, k), dtype=cp.float32)
    plan.KQ_TILE8 = False
    ref = ops.matmul(x, w).copy()
    plan.KQ_TILE8 = True
    try:
        return bool(cp.array_equal(ops.matmul(x, w).view(cp.uint32), ref.view(cp.uint32)))
    finally:
        plan.KQ_TILE8 = False


def measure(results: list, bw: float, run, label: str, **tags) -> None:
    """One benchmark into `results` (tagged), with its fraction of the copy bandwidth, printed after `label`."""
    guarded(results, run, **tags)
    r = results[-1]
    if "us" in r:
        r["bandwidth_fraction"] = r["weight_GBps"] * 1e9 / bw
        print(f"{label} {r['us']:8.1f} us {r['weight_GBps']:7.0f} GB/s {r['bandwidth_fraction']:.2f} "
              f"{r['TFLOPs']:6.1f} TFLOP/s", flush=True)


def build_bits(ops: CudaOps, n: int, k: int, dtype: str, defines: tuple, m: int, prologue: str | None) -> bool:
    """Whether a build of the streaming kernel gives the default build's bits (the same split: a build
    changes no sum) on one random weight and batch of m rows."""
    w = random_weight(n, k, dtype)
    x = probe_activations(m, w, prologue)
    mm = plan.matmul_launch(dtype, m, n, k, ops.sm_count, prologue=prologue)
    outs = []
    for d in ((), defines):
        out = cp.empty((m, n), cp.float32)
        kernel_launch.launch(streaming_kernel(mm, d), mm.grid, mm.block, mm_tc_args(w, x, out, out), mm.shared)
        outs.append(out)
    return bool(cp.array_equal(outs[0].view(cp.uint32), outs[1].view(cp.uint32)))


def probe_build(ops: CudaOps, bw: float, results: list, name: str, dtype: str, defines: tuple, splits, rows: int = 1,
                prologue: str | None = None) -> None:
    """One build of the streaming kernel on one 8B shape: its bits against the default build's at the
    dispatch's split, then its time at each split in `splits` (rows: 1, or 16 with prologue "x16")."""
    n, k = SHAPES_8B[name]
    build = " ".join(f"{d}={v}" for d, v in defines) or "default"
    check: list = []
    guarded(check, lambda: {"equal": build_bits(ops, n, k, dtype, defines, rows, prologue)})
    same = check[0].get("equal", check[0].get("error"))
    base = plan.split_k(n, k, ops.sm_count, dtype)
    for s in splits:
        measure(results, bw,
                lambda s=s: bench_matmul(ops, n, k, rows, dtype, split=s, defines=defines, prologue=prologue),
                f"{name:8} {dtype} {rows:2} rows {build:28} S={s:2} (dispatch {base:2}) bits {same}", shape=name,
                rows=rows, build=build, dispatch_split=base, bits_equal_default=same)


def probe(ops: CudaOps, bw: float, results: list, x16: bool = False, save=lambda: None, builds=None) -> None:
    """The one-row K-quant kernel over builds and splits (each split its own summation order: a
    benchmark of speed only) and at split KQ_MAX_SPLIT its 512-thread build (probe_one16); or (`x16`)
    the 16-row kernel's builds at the dispatch's split. `save()` after each shape and type (a stage
    cut by its time limit keeps what it measured). `builds`: the one-row builds (default PROBE_BUILDS)."""
    for name in ("qo", "gate_up", "down", "lm_head"):
        n, k = SHAPES_8B[name]
        for dtype in ("q4_k", "q6_k"):
            base = plan.split_k(n, k, ops.sm_count, dtype)
            splits = [s for s in sorted({max(1, base // 2), base, base * 2})
                      if s <= plan.KQ_MAX_SPLIT and 2 * s <= k // 32]
            if x16:
                for defines in X16_BUILDS:
                    probe_build(ops, bw, results, name, dtype, defines, [base], 16, "x16")
                probe_rt2(ops, bw, results, name, dtype)
                save()
                continue
            for defines in PROBE_BUILDS if builds is None else builds:
                probe_build(ops, bw, results, name, dtype, defines, splits)
            if base == plan.KQ_MAX_SPLIT:
                probe_one16(ops, bw, results, name, dtype)
            probe_oneh(ops, bw, results, name, dtype)
            save()


def probe_oneh(ops: CudaOps, bw: float, results: list, name: str, dtype: str) -> None:
    """One row at the dispatch's split on mm_*_one(16) (float32 input) and mm_*_one(16)h (its 16-bit
    pairs, plan.ONE_X16_TYPES), default build and LANE_SCALES: each build's outputs equal both ways, and
    each one's time."""
    n, k = SHAPES_8B[name]
    s = plan.split_k(n, k, ops.sm_count, dtype)
    saved = plan.ONE_X16_TYPES
    try:
        plan.ONE_X16_TYPES = (dtype,)
        w, x = random_weight(n, k, dtype), cp.random.standard_normal((1, k), dtype=cp.float32)
        x16 = x.astype(cp.float16).view(cp.uint16)  # round to nearest even: the kernels' pairs
        for defines in ((), LANE_SCALES):
            outs = []
            for inp, pro in ((x, None), (x16, "x16")):
                mm = plan.matmul_launch(dtype, 1, n, k, ops.sm_count, prologue=pro)
                out = cp.empty((1, n), cp.float32)
                kernel_launch.launch(streaming_kernel(mm, defines), mm.grid, mm.block, mm_tc_args(w, inp, out, out),
                                     mm.shared)
                outs.append(out)
            same = bool(cp.array_equal(outs[0].view(cp.uint32), outs[1].view(cp.uint32)))
            build = " ".join(f"{d}={v}" for d, v in defines) or "default"
            for pro in (None, "x16"):
                kern = plan.matmul_launch(dtype, 1, n, k, ops.sm_count, prologue=pro).kernel
                measure(results, bw, lambda pro=pro, d=defines: bench_matmul(ops, n, k, 1, dtype, split=s, defines=d,
                                                                             prologue=pro),
                        f"{name:8} {dtype}  1 rows {kern + ' ' + build:28} S={s:2} bits {same}", shape=name, rows=1,
                        kernel=kern, build=build, bits_equal_f32_input=same)
    finally:
        plan.ONE_X16_TYPES = saved


def probe_one16(ops: CudaOps, bw: float, results: list, name: str, dtype: str) -> None:
    """One row at split KQ_MAX_SPLIT on mm_*_one (one block an SM) and mm_*_one16 (two: plan.ONE16_TYPES):
    the engine's outputs (plain and norm_matmul) equal both ways, and each one's time."""
    n, k = SHAPES_8B[name]
    saved = plan.ONE16_TYPES
    try:
        w, x, nw = random_weight(n, k, dtype), cp.random.standard_normal((1, k), dtype=cp.float32), cp.ones(k, cp.float32)
        outs = []
        for types in ((), (dtype,)):
            plan.ONE16_TYPES = types
            outs.append([ops.matmul(x, w).copy(), ops.norm_matmul(x, nw, 1e-5, w).copy()])
        same = all(bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32))) for a, b in zip(*outs, strict=True))
        for types in ((), (dtype,)):
            plan.ONE16_TYPES = types
            kern = plan.matmul_launch(dtype, 1, n, k, ops.sm_count).kernel
            measure(results, bw, lambda: bench_matmul(ops, n, k, 1, dtype, split=plan.KQ_MAX_SPLIT),
                    f"{name:8} {dtype}  1 rows {kern:28} S={plan.KQ_MAX_SPLIT:2} bits {same}", shape=name, rows=1,
                    kernel=kern, bits_equal_one=same)
    finally:
        plan.ONE16_TYPES = saved


def probe_rt2(ops: CudaOps, bw: float, results: list, name: str, dtype: str) -> None:
    """16 rows of 16-bit pairs on mm_*_tm2h and on mm_*_tm2h2 (plan.X16_RT2_TYPES; its builds RT2_BUILDS):
    the outputs equal both ways, and each one's time."""
    n, k = SHAPES_8B[name]
    saved = plan.X16_RT2_TYPES
    try:
        w = random_weight(n, k, dtype)
        x = probe_activations(16, w, "x16")
        outs = []
        for types in ((), (dtype,)):
            plan.X16_RT2_TYPES = types
            mm = plan.matmul_launch(dtype, 16, n, k, ops.sm_count, prologue="x16")
            out = cp.empty((16, n), cp.float32)
            kernel_launch.launch(streaming_kernel(mm), mm.grid, mm.block, mm_tc_args(w, x, out, out), mm.shared)
            outs.append(out)
        same = bool(cp.array_equal(outs[0].view(cp.uint32), outs[1].view(cp.uint32)))
        for types, builds in (((), [()]), ((dtype,), RT2_BUILDS)):
            plan.X16_RT2_TYPES = types
            kern = plan.matmul_launch(dtype, 16, n, k, ops.sm_count, prologue="x16").kernel
            for defines in builds:
                build = " ".join(f"{d}={v}" for d, v in defines) or "default"
                measure(results, bw, lambda d=defines: bench_matmul(ops, n, k, 16, dtype, split=plan.split_k(
                            n, k, ops.sm_count, dtype), defines=d, prologue="x16"),
                        f"{name:8} {dtype} 16 rows {kern + ' ' + build:28} bits {same}", shape=name, rows=16,
                        kernel=kern, build=build, bits_equal_tm2h=same)
    finally:
        plan.X16_RT2_TYPES = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,4,16,64")
    ap.add_argument("--shapes", default="qo,gate_up,down,lm_head")
    ap.add_argument("--all", action="store_true", help="every integer variant (tiled forced, tr at every type)")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--x16", action="store_true", help="with --probe: the 16-row kernel's builds instead")
    ap.add_argument("--builds", default="", help="with --probe: only these of PROBE_BUILDS (indices, e.g. '0,1')")
    ap.add_argument("--types", default="", help="only these, e.g. 'q4_k:int,q6_k:int,q4_k:f16' (default: every one)")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    bw = copy_bandwidth()
    results: list = []
    pick = (plan.KQ_TILE_ROWS, plan.KQ_TILE_SPLIT, plan.KQ_TR)  # the dispatch's choices of integer kernels
    if args.probe:
        builds = [PROBE_BUILDS[int(i)] for i in args.builds.split(",")] if args.builds else None
        probe(ops, bw, results, args.x16,
              lambda: Path(args.out).write_text(json.dumps({"copy_bandwidth": bw, "results": results}, indent=1)),
              builds)
        return
    for name in args.shapes.split(","):
        n, k = SHAPES_8B[name]
        for m in (int(r) for r in args.rows.split(",")):
            for dtype, integer in (("f16", False), ("q4_k", False), ("q4_k", True), ("q6_k", False), ("q6_k", True),
                                   ("q5_k", True)):
                if args.types and f"{dtype}:{'int' if integer else 'f16'}" not in args.types.split(","):
                    continue
                # K-quants: matmul.cu's f16 MMAs (wide batches: the dispatch's pick, then the 64-row tiled
                # kernel, same bits) or kquant_mm.cu's integer kernels (the activations' quantisation
                # included): the dispatch's pick; at 2-16 rows mmq_tc and mmq_*_tr (its rule's pick, 1, 2, 4 tiles a warp)
                plan.KQ_INTEGER = integer
                variants = [("pick", True, *pick)]
                if m >= 128 and dtype != "f16" and not integer:
                    variants.append(("tile", "tile", *pick))
                if integer and 2 <= m <= 16:
                    variants += [("tc", True, 10**9, None, 0)]
                    if dtype == "q4_k" or args.all:
                        variants += [("tr", True, 10**9, None, None)]  # kq_tr_tiles' pick
                        variants += [(f"tr{r}", True, 10**9, None, r) for r in (1, 2, 4)]
                if integer and m >= 128:  # 8 row tiles a block (plan.KQ_TILE8)
                    variants.append(("tile8", True, *pick))
                if integer and m > 1 and args.all:  # the tiled kernel from 2 rows on: walking all of K, a block per slice
                    variants += [("tile-z1", True, 2, False, None), ("tile-zS", True, 2, True, None)]
                for variant, tiled, tile_rows, by_slice, tr in variants:
                    ops.tiled, plan.KQ_TILE_ROWS, plan.KQ_TILE_SPLIT, plan.KQ_TR = tiled, tile_rows, by_slice, tr
                    tags = {}
                    if variant == "tile8":
                        check: list = []
                        guarded(check, lambda n=n, k=k, m=m, dtype=dtype: {"equal": rows8_bits(ops, n, k, m, dtype)})
                        tags["bits_equal_tile4"] = check[0].get("equal", check[0].get("error"))
                        print(f"{name:8} m={m:3} {dtype:5} tile4r8 bits equal to tile4: {tags['bits_equal_tile4']}")
                        plan.KQ_TILE8 = True
                    family = ops.matmul_family(m, CudaWeight(dtype, (n, k), None))
                    kernel = (plan.kq_integer_launch(dtype, m, n, k, ops.sm_count).kernel
                              if integer and dtype in plan.KQUANT_TYPES else family)
                    measure(results, bw, lambda n=n, k=k, m=m, dtype=dtype: bench_matmul(ops, n, k, m, dtype),
                            f"{name:8} m={m:3} {dtype:5} {variant:11} {kernel:16}", shape=name, family=family,
                            kernel=kernel, integer=integer, variant=variant, **tags)
                    plan.KQ_TILE8 = False
            ops.tiled, (plan.KQ_TILE_ROWS, plan.KQ_TILE_SPLIT, plan.KQ_TR) = True, pick
        Path(args.out).write_text(json.dumps({"copy_bandwidth": bw, "results": results}, indent=1))  # so far
    plan.KQ_INTEGER = True
    for k in (4096, 14336):  # the integer kernels' activation quantisation alone (32 launches a graph)
        for m in (int(r) for r in args.rows.split(",")):
            x, w = cp.random.standard_normal((m, k), dtype=cp.float32), CudaWeight("q4_k", (16, k), None)
            nw = cp.random.standard_normal(k, dtype=cp.float32)
            for norm in (None, nw):  # plain, and with rms_norm fused
                us = timed(lambda x=x, w=w, norm=norm: [ops._kq_act(x, w, norm, 1e-5) for _ in range(32)]) / 32 * 1e6
                results.append({"stage": "kq_quant_x", "k": k, "m": m, "norm": norm is not None, "us": us})
                print(f"kq_quant_x k={k:5} m={m:3} norm={norm is not None:d} {us:8.2f} us", flush=True)
    Path(args.out).write_text(json.dumps({"copy_bandwidth": bw, "results": results}, indent=1))


if __name__ == "__main__":
    main()
