"""One-row matmuls whose row tiles fill the SMs' last wave poorly (the 4B hybrid's out_proj, o_proj
and down: 160 tiles on 132 SMs): matmul.cu's one-row kernel against its cluster builds (mm_*_one_cN:
a row tile's K slices over N blocks, plan.cluster_launch), each timed in graphs of PDL launches over
rotated weight copies, and whether the outputs are bit-equal (they must be: the same sums).

    python3 bench/probes/cluster_ab.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy as cp  # noqa: E402

from bench.gpu_ops import ROTATE_BYTES, random_weight, timed, write_json  # noqa: E402
from kernels.cuda import plan  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.ops import EPI_RESIDUAL, mm_tc_args, streaming_kernel  # noqa: E402

# (name, n, k): the 4B hybrid's, then the 8B's and 1B's (whose tiles fill their waves: no cluster planned)
SHAPES = [("dn_out", 2560, 4096), ("down", 2560, 9216), ("8b_qo", 4096, 4096), ("8b_down", 4096, 14336),
          ("1b_down", 2048, 8192)]


def probe(name: str, n: int, k: int, dtype: str, sm: int) -> list[dict]:
    w0 = random_weight(n, k, dtype)
    ws = [w0] + [random_weight(n, k, dtype) for _ in range(max(1, min(16, ROTATE_BYTES // w0.nbytes)) - 1)]
    x = cp.random.standard_normal((1, k), dtype=cp.float32)
    res = cp.random.standard_normal((1, n), dtype=cp.float32)
    base = plan.matmul_launch(dtype, 1, n, k, sm)
    rows, want = [], None
    for cl in (0, *plan.CLUSTER_SIZES):
        mm = base if cl == 0 else plan.cluster_launch(base, dtype, cl, sm)
        if mm is None:  # the plan keeps this shape off clusters: time the build anyway, forced
            waste, plan.CLUSTER_WASTE = plan.CLUSTER_WASTE, 0.0
            mm = plan.cluster_launch(base, dtype, cl, sm)
            plan.CLUSTER_WASTE = waste
            if mm is None:
                continue
        fn = streaming_kernel(mm, () if cl == 0 else plan.CLUSTER_BUILD)
        outs = [cp.empty((1, n), cp.float32) for _ in ws]

        def run(fn=fn, mm=mm, outs=outs):
            for w, o in zip(ws, outs, strict=True):
                launch(fn, mm.grid, mm.block, mm_tc_args(w, x, o, o, None, res, EPI_RESIDUAL), shared=mm.shared)

        t = timed(run) / len(ws)
        got = b"".join(cp.asnumpy(o).tobytes() for o in outs)
        want = got if want is None else want
        row = {"shape": name, "n": n, "k": k, "dtype": dtype, "cluster": cl, "kernel": mm.kernel, "split": mm.split,
               "grid": mm.grid[0], "block": mm.block[0], "planned": cl == 0 or plan.cluster_launch(base, dtype, cl, sm) is not None,
               "us": round(t * 1e6, 2), "TBps": round(w0.nbytes / t / 1e12, 3), "bits_equal": got == want}
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sm = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    report = {"sm_count": sm, "rows": []}
    for dtype in ("f16", "bf16"):
        for name, n, k in SHAPES if dtype == "f16" else SHAPES[:2]:
            report["rows"] += probe(name, n, k, dtype, sm)
            write_json(args.out, report)
    report["all_bits_equal"] = all(r["bits_equal"] for r in report["rows"])
    write_json(args.out, report)
    print("all bits equal:", report["all_bits_equal"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
