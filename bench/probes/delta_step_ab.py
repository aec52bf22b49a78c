"""The token-by-token delta rule on the 4B hybrid's shape (16 key heads, 32 value heads of 128):
the current delta_step (a block per head and 32-column slice) against an older deltanet.cu's
(a block per head) given as a file, kernel time by CUDA events and the outputs' difference.

    python3 bench/probes/delta_step_ab.py OLD_DELTANET_CU [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import back_to_back_ms, write_json  # noqa: E402
from lockstep_kernels.base import RecurrentRows  # noqa: E402
from lockstep_kernels.cuda.launch import launch  # noqa: E402
from lockstep_kernels.cuda.modules import COMMON, HERE, OPTIONS, kernel  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

KH, VH, KD, VD, KW = 16, 32, 128, 128, 4
QKV = 2 * KH * KD + VH * VD


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("--out")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    src = Path(args.old).read_text().replace(f'#include "{COMMON}"', (HERE / COMMON).read_text())
    old = cp.RawModule(code=src, options=OPTIONS + ("-DKD=128", "-DVT=128")).get_function("delta_step")
    new = kernel("deltanet.cu", "delta_step", (("KD", KD), ("VT", 128)))
    rng = np.random.default_rng(0)
    a_log = cp.asarray(np.log(np.linspace(1.0, 16.0, VH)).astype(np.float32))
    dt_bias = cp.zeros(VH, cp.float32)
    res = {}
    for s in (1, 16):
        states = [ops.state_alloc(1, QKV, KW, VH, KD, VD) for _ in range(s)]
        init = [cp.asarray((rng.standard_normal(st.buf.size) * 0.1).astype(np.float32)) for st in states]
        rows = RecurrentRows([(i, i + 1) for i in range(s)], [100] * s, states, [False] * s, [()] * s)
        meta = ops._step_meta(rows)
        mixed = cp.asarray(rng.standard_normal((s, QKV)).astype(np.float32))
        a = cp.asarray(rng.standard_normal((s, VH)).astype(np.float32))
        b = cp.asarray(rng.standard_normal((s, VH)).astype(np.float32))
        out = cp.empty((s, VH, VD), cp.float32)
        argv = (mixed, a, b, np.int64(VH), a_log, dt_bias, out, meta.desc, np.int32(KH), np.int32(VH), np.int32(VD),
                np.float32(KD ** -0.5), np.int64(0), np.int64(states[0].conv_len))
        runs = {"old": lambda argv=argv, s=s: launch(old, (VH, s), (128,), argv),
                "new": lambda argv=argv, s=s: launch(new, (VH, s, VD // 32), (128,), argv)}
        got = {}
        for name, fn in runs.items():
            for st, x in zip(states, init, strict=True):
                st.buf[...] = x
            fn()
            got[name] = (cp.asnumpy(out).astype(np.float64), np.concatenate([cp.asnumpy(st.buf) for st in states]))
        err = [float(np.linalg.norm(got["new"][i] - got["old"][i]) / np.linalg.norm(got["old"][i])) for i in (0, 1)]
        res[s] = {"old_us": round(1000 * back_to_back_ms(runs["old"], 200), 2),
                  "new_us": round(1000 * back_to_back_ms(runs["new"], 200), 2),
                  "rel_l2_out": err[0], "rel_l2_state": err[1]}
        write_json(args.out, res)
        print(f"delta_step, {s} sequences: old {res[s]['old_us']} us, new {res[s]['new_us']} us; new vs old "
              f"relative L2 {err[0]:.2e} (outputs), {err[1]:.2e} (state)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
