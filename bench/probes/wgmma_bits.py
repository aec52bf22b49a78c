"""Runs wgmma_bits.cu on the device and reports, over many random trials, whether wgmma (A from
registers or from shared memory) gives mma.sync's bits, and whether the k order inside one
mma.sync changes them. Prints one JSON object; --out writes it too.

Also reports whether NVRTC (CuPy's compiler) accepts the sm_90a target that wgmma needs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import cupy as cp
import numpy as np

HERE = Path(__file__).parent
VARIANTS = ("mma", "mma_k_reversed", "mma_k_xor8", "wgmma_rs", "wgmma_ss")


def operands(rng, trials: int):
    def f16(shape, lo, hi):
        mag = np.exp2(rng.uniform(lo, hi, shape)) * rng.choice([-1.0, 1.0], shape)
        return mag.astype(np.float16)

    a = f16((trials, 64, 16), -10, 4)
    b = f16((trials, 16, 8), -10, 4)
    c = (np.exp2(rng.uniform(-6, 10, (trials, 64, 8))) * rng.choice([-1.0, 1.0], (trials, 64, 8))).astype(np.float32)
    c[: trials // 4] = 0  # a quarter with no accumulator
    return a, b, c


def run_one(cubin: str, trials: int, lbo_is_k: int, variant: int, out_path: str) -> None:
    """One variant in its own process: a faulting wgmma descriptor must not take the others down."""
    fn = cp.RawModule(path=cubin).get_function("probe")
    a, b, c = operands(np.random.default_rng(7), trials)
    da, db, dc = (cp.asarray(x) for x in (a.view(np.uint16), b.view(np.uint16), c))
    out = cp.zeros((trials, 64, 8), cp.float32)
    fn((trials,), (128,), (da, db, dc, out, np.int32(lbo_is_k), np.int32(variant)))
    np.save(out_path, cp.asnumpy(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=4096)
    ap.add_argument("--out")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # cubin lbo_is_k variant out.npy
    args = ap.parse_args()
    if args.one:
        run_one(args.one[0], args.trials, int(args.one[1]), int(args.one[2]), args.one[3])
        return
    src = HERE / "wgmma_bits.cu"
    res: dict = {}
    try:
        cp.RawModule(code=src.read_text(), options=("-arch=sm_90a",)).get_function("probe")
        res["nvrtc_sm_90a"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported; the nvcc build below is what the probe runs
        res["nvrtc_sm_90a"] = f"{type(e).__name__}: {str(e)[:300]}"
    a, b, c = operands(np.random.default_rng(7), args.trials)
    ref = np.einsum("tmk,tkn->tmn", a.astype(np.float64), b.astype(np.float64)) + c
    with tempfile.TemporaryDirectory() as tmp:
        cubin = str(Path(tmp) / "probe.cubin")
        subprocess.run(["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-o", cubin, str(src)], check=True)
        got = {}
        for lbo_is_k in (1, 0):
            for v, name in enumerate(VARIANTS):
                if v < 3 and lbo_is_k == 0:
                    continue
                npy = str(Path(tmp) / f"{v}_{lbo_is_k}.npy")
                done = subprocess.run([sys.executable, __file__, "--trials", str(args.trials), "--one", cubin,
                                       str(lbo_is_k), str(v), npy], capture_output=True, text=True)
                key = f"{name} lbo_is_k={lbo_is_k}" if v >= 3 else name
                if done.returncode:
                    res[key] = {"error": done.stderr.strip().splitlines()[-1][:300]}
                    continue
                got[key] = np.load(npy)
        base = got.get("mma")
        for key, v in got.items():
            err = np.abs(v - ref) / np.maximum(np.abs(ref), 1e-30)
            res[key] = {"median_rel_err": float(np.median(err)), "max_rel_err": float(err.max()),
                        "bits_equal_to_mma": None if base is None else
                        float(np.mean(v.view(np.uint32) == base.view(np.uint32)))}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
