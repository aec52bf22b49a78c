"""mm_wgmma_tma's builds against each other on the 8B prefill shapes (plan.WGMMA_BUILDS; the same sums):
TFLOP/s with the engine's epilogues (q|k|v plain, o and down with the residual, gate|up fused with
SiLU into 16 bits), and every element's bits against the default build's and, plain, against mm_tc's
(the streaming kernel decode uses). `g3p_forced`: 192-row persistent tiles on gate|up, where the plan
keeps 128 (does the shorter L2 traffic a row pay for the last wave?); `_s5`, `_s6`: 5 or 6 stages; `_lag1k`,
`_lag2k`: the second warpgroup starts 1000 / 2000 clocks late; `_timing` (other bits): S = 1, no stores;
`_early`: the first stages' weights copied before the wait for the kernel before (WG_EARLY).
  python3 bench/probes/mm_wgmma_ab.py [--rows 512,2048] [--builds tiles,persist,g3,g3p] --out x.json"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import ROTATE_BYTES, random_weight, timed  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import EPI_OUT16, EPI_RESIDUAL, EPI_SILU, CudaOps  # noqa: E402

SHAPES = {"qkv": (6144, 4096, 0), "o": (4096, 4096, EPI_RESIDUAL),
          "gate_up": (28672, 4096, EPI_SILU | EPI_OUT16), "down": (4096, 14336, EPI_RESIDUAL)}


def launches(builds: list[str], m: int, n: int, k: int, sm: int, name: str) -> tuple[dict, dict]:
    """Each build's launch, a build whose launch equals an earlier one's left out (and named in `alias`)."""
    out: dict = {}
    alias: dict = {}
    for b in builds:
        wg = plan.wgmma_launch("f16", m, n, k, sm, b)
        same = [o for o, v in out.items() if v == wg]
        if same:
            alias[b] = same[0]
        elif wg is not None:
            out[b] = wg
    if name == "gate_up" and "g3p" in builds:
        out["g3p_forced"] = plan.wgmma_build_launch("f16", m, n, k, sm, 192, True)
    for b, stages in (("persist", 6), ("g3p", 5), ("g3p_forced", 5)):  # deeper rings (timing; plan: 4)
        wg = out.get(b)
        if wg is not None and plan.wgmma_rows(wg) > 64 and (b != "g3p" or plan.wgmma_rows(wg) == 192):
            rows = plan.wgmma_rows(wg)
            defines = tuple((d, stages if d == "WG_STAGES" else v) for d, v in wg.defines)
            out[f"{b}_s{stages}"] = dataclasses.replace(wg, defines=defines,
                                                        shared=stages * (2 * (rows + plan.WIDE_M) * 64 + 16) + 1024)
    if "persist" in out:  # timing only, other sums or none stored: the slice joins' and the stores' cost
        wg = out["persist"]
        out["persist_S1_timing"] = dataclasses.replace(wg, split=1)
        out["persist_nostore_timing"] = dataclasses.replace(wg, defines=(*wg.defines, ("WG_NOSTORE", 1)))
    for b in ("tiles", "persist", "g3p", "mcp"):  # the first weights copied before the wait for the last kernel
        if b in out and ("persist" in builds or b == "mcp"):
            out[f"{b}_early"] = dataclasses.replace(out[b], defines=(*out[b].defines, ("WG_EARLY", 1)))
    if "persist_s6" in out:  # the second warpgroup late by ~0.5 / 1 us: slice drains apart (timing)
        for lag in (1000, 2000):
            wg = out["persist_s6"]
            out[f"persist_s6_lag{lag // 1000}k"] = dataclasses.replace(wg, defines=(*wg.defines, ("WG_LAG", lag)))
    return out, alias


def _build(job: tuple) -> float:
    """One module compiled into CuPy's disk cache (a process of its own: NVRTC runs one compile a process)."""
    import time

    from lockstep_kernels.cuda.modules import kernel

    t0 = time.perf_counter()
    kernel(*job)
    return time.perf_counter() - t0


def compile_all(a) -> None:
    """Every module the probe runs, compiled side by side before anything is timed."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    jobs = {("matmul.cu", "act_to_16", ())}
    for name, (n, k, _) in SHAPES.items():
        for m in map(int, a.rows.split(",")):
            jobs |= {("wgmma.cu", wg.kernel, wg.defines) for wg in launches(a.builds.split(","), m, n, k, a.sm, name)[0].values()}
    with ProcessPoolExecutor(len(jobs), mp_context=get_context("spawn")) as pool:
        took = list(pool.map(_build, sorted(jobs)))
    print(f"compiled {len(jobs)} modules, longest {max(took):.1f} s", flush=True)


def pick(files: list[str]) -> str:
    """The plan build for the engine: the shortest 512-row layer among those with the default's and mm_tc's
    bits in every cell of every file and at least 1 % faster than the default; "none" if none."""
    layer: dict = {}
    bad: set = set()
    for f in files:
        try:
            cells = json.loads(Path(f).read_text())["cells"]
        except (OSError, ValueError, KeyError):
            continue
        if len(cells) != 2 * len(SHAPES):
            continue  # a run cut short
        for b in plan.WGMMA_BUILDS:
            got = [c.get(c["same_launch"].get(b, b)) for c in cells]
            if any(g is None for g in got):
                continue
            if not all(g["same_bits_as_tiles"] and g["same_bits_as_mm_tc"] for g in got):
                bad.add(b)
            layer[b] = sum(g["us"] for g, c in zip(got, cells, strict=True) if c["m"] == 512) / (
                sum(c["tiles"]["us"] for c in cells if c["m"] == 512))  # against this file's default
    good = {b: v for b, v in layer.items() if b != "tiles" and b not in bad and v < 0.99}
    return min(good, key=good.get) if good else "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="512,2048")
    ap.add_argument("--builds", default=",".join(plan.WGMMA_BUILDS))
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, builds alternated in each")
    ap.add_argument("--compile", action="store_true", help="only build the modules (in parallel), for --sm SMs")
    ap.add_argument("--sm", type=int, default=132)
    ap.add_argument("--out")
    ap.add_argument("--pick", nargs="+", metavar="JSON", help="print the engine's build from these runs' files")
    a = ap.parse_args()
    if a.pick:
        print(pick(a.pick))
        return
    if a.compile:
        compile_all(a)
        return
    ops, ref = CudaOps(exact=True), CudaOps(exact=True)
    ref.tiled = False  # mm_tc
    sm, cells = ops.sm_count, []
    for name, (n, k, flags) in SHAPES.items():
        w0 = random_weight(n, k, "f16")
        ws = [w0] + [random_weight(n, k, "f16") for _ in range(max(0, min(8, ROTATE_BYTES // w0.nbytes) - 1))]
        for m in map(int, a.rows.split(",")):
            x = cp.random.standard_normal((m, k), dtype=cp.float32)
            res = cp.random.standard_normal((m, n), dtype=cp.float32)
            x16 = ops._act16(x, w0.kp, False, perm=True)
            plain_ref = cp.asnumpy(ref.matmul(x, w0))
            builds, alias = launches(a.builds.split(","), m, n, k, sm, name)
            outs = {b: (cp.empty((m, n // 2), cp.uint16) if flags & EPI_OUT16 else cp.empty((m, n), cp.float32))
                    for b in builds}

            def run(wg, out, ws=ws, x16=x16, res=res, flags=flags):
                for w in ws:
                    ops._wgmma(x16, w, wg, ops._dummy, res, out, flags)

            times: dict = {b: [] for b in builds}
            for _ in range(a.rounds):
                for b, wg in builds.items():
                    times[b].append(timed(lambda wg=wg, out=outs[b]: run(wg, out)) / len(ws))
            cell = {"shape": name, "n": n, "k": k, "m": m, "flags": flags, "same_launch": alias}
            base = None
            for b, wg in builds.items():
                outs[b].fill(0xFF if flags & EPI_OUT16 else np.nan)  # poisoned: every element must be written
                ops._wgmma(x16, w0, wg, ops._dummy, res, outs[b], flags)
                got = cp.asnumpy(outs[b])
                base = got if base is None else base
                plain = cp.empty((m, n), cp.float32)
                plain.fill(np.nan)
                ops._wgmma(x16, w0, wg, ops._dummy, ops._dummy, plain, 0)
                plain = cp.asnumpy(plain)
                t = min(times[b])
                cell[b] = {"us": round(t * 1e6, 2), "TFLOPs": round(2 * m * n * k / t / 1e12, 1),
                           "rounds_us": [round(v * 1e6, 2) for v in times[b]], "rows": plan.wgmma_rows(wg),
                           "grid": wg.grid, "block": wg.block[0],
                           "same_bits_as_tiles": bool(got.tobytes() == base.tobytes()),
                           "same_bits_as_mm_tc": bool(plain.tobytes() == plain_ref.tobytes()),
                           "differ_mm_tc": int(np.count_nonzero(plain.view(np.uint32) != plain_ref.view(np.uint32)))}
            cells.append(cell)
            print(f"{name:8s} m {m:5d} " + "  ".join(
                f"{b} {v['us']:7.1f} us {v['TFLOPs']:5.0f} TF {'=' if v['same_bits_as_tiles'] else 'DIFF'}"
                f"{'' if v['same_bits_as_mm_tc'] else ' !tc'}" for b, v in cell.items() if isinstance(v, dict) and "us" in v), flush=True)
            if a.out:
                Path(a.out).write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                                   "cells": cells}, indent=1))
    for m in map(int, a.rows.split(",")):  # a layer's four matmuls
        row = [c for c in cells if c["m"] == m]
        tot = {b: sum(c[c["same_launch"].get(b, b)]["us"] for c in row) for b in a.builds.split(",")}
        flop = sum(2 * m * c["n"] * c["k"] for c in row)
        print(f"layer m {m}: " + "  ".join(f"{b} {t:7.1f} us {flop / t / 1e6:5.0f} TF" for b, t in tot.items()))


if __name__ == "__main__":
    main()
