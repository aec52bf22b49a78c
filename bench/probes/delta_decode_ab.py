"""A decode step's DeltaNet mixer on the 4B hybrid's shape (16 key heads, 32 value heads of 128, conv 4):
an older deltanet.cu's three launches (conv1d_silu, delta_step, gated_rms_norm; given as a file) against
delta_decode's one, back to back from Python (launch-bound at 1 sequence: the graph profile is the
in-step measure), and whether the normalised outputs, conv windows and delta states are bit-equal.

    python3 bench/probes/delta_decode_ab.py OLD_DELTANET_CU [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_ops import back_to_back_ms, write_json  # noqa: E402
from kernels.base import RecurrentRows  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.modules import COMMON, HERE, OPTIONS, kernel  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402

KH, VH, KD, VD, KW = 16, 32, 128, 128, 4
QKV = 2 * KH * KD + VH * VD
WIDTH = QKV + VH * VD + 2 * VH
EPS = 1e-6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("--out")
    args = ap.parse_args()
    ops = CudaOps(exact=True)
    src = Path(args.old).read_text().replace(f'#include "{COMMON}"', (HERE / COMMON).read_text())
    mod = cp.RawModule(code=src, options=OPTIONS + ("-DKD=128", "-DVT=128"))
    conv, step, gnorm = (mod.get_function(f) for f in ("conv1d_silu", "delta_step", "gated_rms_norm"))
    fused = kernel("deltanet.cu", "delta_decode", (("KD", KD), ("VT", 128), ("NS", VD // 32)))
    rng = np.random.default_rng(0)
    a_log = cp.asarray(np.log(np.linspace(1.0, 16.0, VH)).astype(np.float32))
    dt_bias = cp.asarray(np.linspace(-0.5, 0.5, VH).astype(np.float32))
    cw = cp.asarray((rng.standard_normal((QKV, KW)) * 0.3).astype(np.float32))
    nw = cp.asarray((1 + 0.1 * rng.standard_normal(VD)).astype(np.float32))
    res = {}
    for s in (1, 16):
        res[s] = measure(ops, s, (conv, step, gnorm), fused, (a_log, dt_bias, cw, nw), rng)
        write_json(args.out, res)
        print(f"{s} sequences: {res[s]}", flush=True)
    return 0


def measure(ops, s: int, old, fused, weights, rng) -> dict:
    """One step of s sequences, one row each, from the same states both ways."""
    conv, step, gnorm = old
    a_log, dt_bias, cw, nw = weights
    states = [ops.state_alloc(1, QKV, KW, VH, KD, VD) for _ in range(s)]
    init = [cp.asarray((rng.standard_normal(st.buf.size) * 0.1).astype(np.float32)) for st in states]
    meta = ops._step_meta(RecurrentRows([(i, i + 1) for i in range(s)], [100] * s, states, [False] * s, [()] * s))
    y = cp.asarray(rng.standard_normal((s, WIDTH)).astype(np.float32))
    mixed = cp.empty((s, QKV), cp.float32)
    core = cp.empty((s, VH, VD), cp.float32)
    out = cp.empty((s, VH * VD), cp.float32)
    b0 = QKV + VH * VD
    gate = cp.ascontiguousarray(y[:, QKV:b0])
    a, b = y[:, b0 + VH :], y[:, b0 : b0 + VH]

    def three():
        launch(conv, ((QKV + 127) // 128, s), (128,), (y, np.int64(WIDTH), cw, mixed, meta.desc, np.int32(QKV),
                                                       np.int32(KW), np.int64(0), meta.snap_rel, ops._dummy))
        launch(step, (VH, s, VD // 32), (128,),
               (mixed, a, b, np.int64(WIDTH), a_log, dt_bias, core, meta.desc, np.int32(KH), np.int32(VH),
                np.int32(VD), np.float32(KD ** -0.5), np.int64(0), np.int64(states[0].conv_len)))
        launch(gnorm, (s * VH,), (256,), (core, nw, gate, out, np.int32(VD), np.float32(EPS)))

    def one():
        launch(fused, (VH, s), (128 * VD // 32,),
               (y, np.int64(WIDTH), cw, np.int32(KW), a_log, dt_bias, nw, np.float32(EPS), out, meta.desc,
                np.int32(KH), np.int32(VH), np.int32(VD), np.float32(KD ** -0.5), np.int64(0), ops._arrive))

    got = {}
    for name, fn in (("old", three), ("fused", one)):
        for st, x in zip(states, init, strict=True):
            st.buf[...] = x
        out[...] = 0
        fn()
        got[name] = (cp.asnumpy(out).tobytes(), b"".join(cp.asnumpy(st.buf).tobytes() for st in states))
    return {"old_three_launches_us": round(1000 * back_to_back_ms(three, 200), 2),
            "delta_decode_us": round(1000 * back_to_back_ms(one, 200), 2),
            "outputs_bit_equal": got["old"][0] == got["fused"][0], "states_bit_equal": got["old"][1] == got["fused"][1]}


if __name__ == "__main__":
    raise SystemExit(main())
