"""One-row (decode) matmuls of the 4B hybrid and 8B dense shapes: matmul.cu's one-row kernel (mm_tc
at split_k's split) against matvec.cu's ring kernel in several builds and grids, and whether their
outputs are bit-equal (they must be: the same sums). Norm shapes also time rms_norm then the
one-row kernel, and the kernels that normalise their row themselves.

    python3 bench/probes/matvec_ab.py [--out FILE] [--shapes 4b|8b|all]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench.gpu_ops import ROTATE_BYTES, random_weight, timed  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.launch import launch  # noqa: E402
from lockstep_kernels.cuda.modules import kernel  # noqa: E402
from lockstep_kernels.cuda.ops import EPI_RESIDUAL, EPI_SILU, mm_tc_args, streaming_kernel  # noqa: E402

# (name, n, k, normed in the engine's decode step)
SHAPES_4B = [("dn_in", 12352, 2560, True), ("dn_out", 2560, 4096, False), ("attn_qkv", 10240, 2560, True),
             ("attn_o", 2560, 4096, False), ("gate_up", 18432, 2560, True), ("down", 2560, 9216, False),
             ("lm_head", 248320, 2560, True)]
SHAPES_8B = [("8b_qo", 4096, 4096, False), ("8b_gate_up", 28672, 4096, True), ("8b_down", 4096, 14336, False),
             ("8b_lm_head", 128256, 4096, True)]
# (label, defines, max split of the build)
BUILDS = [("u4s2", (), 16), ("u4s3", (("MV_ST", 3),), 16), ("u8s2", (("MV_U", 8), ("MV_MAX_WARPS", 8)), 8),
          ("u4s1w32", (("MV_ST", 1), ("MV_MAX_WARPS", 32)), 32), ("u2s2w32", (("MV_U", 2), ("MV_MAX_WARPS", 32)), 32),
          ("u4s2nohint", (("MV_HINT", 0),), 16)]
WARPS_PER_SM = (8, 16, 32, 64)


def launch_old(mm, w, x, out, d, res, flags, nw) -> None:
    launch(streaming_kernel(mm), mm.grid, mm.block, mm_tc_args(w, x, out, d, None, res, flags, nw, 1e-6), shared=mm.shared)


def launch_sep(one, w, x, y, out, d, nw) -> None:
    launch(kernel("rows.cu", "rms_norm"), (1,), (256,), (x, nw, y, np.int32(x.shape[1]), np.float32(1e-6)))
    launch(streaming_kernel(one), one.grid, one.block, mm_tc_args(w, y, out, d), shared=one.shared)


def launch_new(fn, mv, w, x, out, d, res, flags, nw) -> None:
    n, k = w.shape
    launch(fn, mv.grid, mv.block, (w.data, x, d, d if res is None else res, out, np.int32(n), np.int32(k),
                                   np.int32(w.kp), np.int32(flags), d if nw is None else nw, np.float32(1e-6), d,
                                   np.int32(0)), shared=mv.shared)


def probe_shape(name: str, n: int, k: int, normed: bool, sm: int, record) -> None:
    w0 = random_weight(n, k, "f16")
    ws = [w0] + [random_weight(n, k, "f16") for _ in range(max(1, min(16, ROTATE_BYTES // w0.nbytes)) - 1)]
    x = cp.random.standard_normal((1, k), dtype=cp.float32)
    nw_row = cp.random.standard_normal(k, dtype=cp.float32)
    res_row = cp.random.standard_normal((1, n), dtype=cp.float32)
    d = cp.zeros(4, cp.float32)
    gb = w0.nbytes / 1e9
    for prologue in ("norm", None) if normed else (None,):
        nw = nw_row if prologue else None
        flag_sets = [0, EPI_SILU] if name.endswith("gate_up") else [0, EPI_RESIDUAL] if n <= 4096 else [0]
        for flags in flag_sets:
            mm = plan.matmul_launch("f16", 1, n, k, sm, prologue=prologue)
            ref = cp.empty((1, n // 2 if flags & EPI_SILU else n), cp.float32)
            res = res_row if flags & EPI_RESIDUAL else None
            launch_old(mm, w0, x, ref, d, res, flags, nw)
            out = cp.empty_like(ref)
            if flags == 0:
                t = timed(lambda mm=mm, out=out, nw=nw: [launch_old(mm, w, x, out, d, None, 0, nw) for w in ws]) / len(ws)
                record(dict(name=name, n=n, k=k, kernel=mm.kernel, prologue=prologue, split=mm.split, grid=mm.grid[0],
                            us=t * 1e6, GBps=gb / t))
                if prologue == "norm":  # rms_norm, then the one-row kernel
                    one, y = plan.matmul_launch("f16", 1, n, k, sm), cp.empty_like(x)
                    t = timed(lambda one=one, y=y, out=out: [launch_sep(one, w, x, y, out, d, nw_row) for w in ws]) / len(ws)
                    record(dict(name=name, n=n, k=k, kernel="rms_norm+" + one.kernel, prologue=None, split=one.split,
                                grid=one.grid[0], us=t * 1e6, GBps=gb / t))
            for label, defines, max_split in BUILDS:
                for wps in WARPS_PER_SM if flags == 0 else (16,):
                    mv = plan.matvec_launch("f16", n, k, sm, prologue, warps_per_sm=wps, max_split=max_split)
                    if mv is None:
                        continue
                    fn = kernel("matvec.cu", mv.kernel, defines)
                    got = cp.full_like(ref, np.nan)
                    launch_new(fn, mv, w0, x, got, d, res, flags, nw)
                    equal = bool(cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32)))
                    r = dict(name=name, n=n, k=k, kernel=mv.kernel, build=label, wps=wps, prologue=prologue,
                             split=mv.split, grid=mv.grid[0], flags=flags, equal=equal, us=0.0, GBps=0.0)
                    if flags == 0:
                        t = timed(lambda fn=fn, mv=mv, nw=nw, out=out: [launch_new(fn, mv, w, x, out, d, None, 0, nw)
                                                               for w in ws]) / len(ws)
                        r.update(us=t * 1e6, GBps=gb / t)
                    record(r)


def probe_gated(n: int, heads: int, d: int, sm: int, record) -> None:
    """out_proj of a DeltaNet layer: gated_rms_norm then the one-row kernel, against mv_f16_gated."""
    k = heads * d
    w0 = random_weight(n, k, "f16")
    ws = [w0] + [random_weight(n, k, "f16") for _ in range(max(1, min(16, ROTATE_BYTES // w0.nbytes)) - 1)]
    x, gate = (cp.random.standard_normal((heads, d), dtype=cp.float32) for _ in range(2))
    nw, res = cp.random.standard_normal(d, dtype=cp.float32), cp.random.standard_normal((1, n), dtype=cp.float32)
    y, d0 = cp.empty_like(x), cp.zeros(4, cp.float32)
    one = plan.matmul_launch("f16", 1, n, k, sm)

    def sep(w, out):
        launch(kernel("deltanet.cu", "gated_rms_norm"), (heads,), (256,), (x, nw, gate, y, np.int32(d), np.float32(1e-6)))
        launch(streaming_kernel(one), one.grid, one.block, mm_tc_args(w, y.reshape(1, k), out, d0, None, res, EPI_RESIDUAL),
               shared=one.shared)
    ref = cp.empty((1, n), cp.float32)
    sep(w0, ref)
    t = timed(lambda: [sep(w, ref) for w in ws]) / len(ws)
    record(dict(name="dn_out_gated", n=n, k=k, kernel="gated_rms_norm+" + one.kernel, prologue=None, split=one.split,
                grid=one.grid[0], us=t * 1e6, GBps=w0.nbytes / 1e9 / t))
    for label, defines, max_split in BUILDS:
        mv = plan.matvec_launch("f16", n, k, sm, "gated", warps_per_sm=16, max_split=max_split)
        if mv is None:
            continue
        fn = kernel("matvec.cu", mv.kernel, defines)

        def new(w, out, fn=fn, mv=mv):
            launch(fn, mv.grid, mv.block, (w.data, x, d0, res, out, np.int32(n), np.int32(k), np.int32(w.kp),
                                           np.int32(EPI_RESIDUAL), nw, np.float32(1e-6), gate, np.int32(d)),
                   shared=mv.shared)
        got = cp.full_like(ref, np.nan)
        new(w0, got)
        t = timed(lambda new=new, got=got: [new(w, got) for w in ws]) / len(ws)
        record(dict(name="dn_out_gated", n=n, k=k, kernel=mv.kernel, build=label, wps=16, prologue="gated",
                    split=mv.split, grid=mv.grid[0], flags=EPI_RESIDUAL, us=t * 1e6, GBps=w0.nbytes / 1e9 / t,
                    equal=bool(cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32)))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="all")
    args = ap.parse_args()
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    shapes = {"4b": SHAPES_4B, "8b": SHAPES_8B}.get(args.shapes, SHAPES_4B + SHAPES_8B)
    res: list[dict] = []

    def record(r: dict) -> None:
        res.append(r)
        print(f"{r['name']:<11} {r['kernel']:<26} {r.get('build', ''):<11} wps {r.get('wps', '-'):>3} grid "
              f"{r['grid']:>6} {r['us']:8.2f} us {r['GBps']:6.0f} GB/s equal {r.get('equal', '-')}", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1))

    if args.shapes != "8b":
        probe_gated(2560, 32, 128, sm, record)
    for name, n, k, normed in shapes:
        probe_shape(name, n, k, normed, sm, record)
        cp.get_default_memory_pool().free_all_blocks()
    bad = [r for r in res if r.get("equal") is False]
    print(f"bit-equal: {sum(1 for r in res if r.get('equal'))} of {sum(1 for r in res if 'equal' in r)}; "
          f"unequal: {[(r['name'], r['build'], r['flags']) for r in bad][:10]}")
    best: dict = {}
    for r in res:
        key = (r["name"], r.get("prologue"))
        if r["us"] > 0 and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    for (nm, pro), r in best.items():
        print(f"best {nm:<11} {pro or '':<5} {r['kernel']} {r.get('build', '')} wps {r.get('wps', '-')} {r['us']:.2f} us")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
