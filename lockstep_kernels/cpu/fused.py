"""A layer's small steps joined to the row kernel over 16-bit weights, one compiled call each: the
RMS norm before a product, a whole FFN (norm, gate | up, silu, down, residual), an embedding lookup.

Each is the standalone kernels' arithmetic in the standalone kernels' order (the same compiled
functions: rms_norm_rows, rows_16), so a row gets the bits it gets through the separate ops, and
none of it depends on the number of rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lockstep_kernels.cpu.compiled import (
    _FLAGS,
    GATE_UP,
    PLAIN,
    RESIDUAL,
    _bf16,
    _f16,
    rms_norm_rows,
    rows_16,
    rows_16_parallel,
)
from lockstep_kernels.cpu.workers import CTL_WORDS

MATVEC_EPOCH = 6  # numba caches a function keyed on its own file only: bump with matvec.EPOCH, or a stale copy runs

@njit(**_FLAGS)
def norm_rows_16(x, norm_w, eps, w, kind, out, res, mode):
    """rows_16(rms_norm(x), w, ...) (res, mode as rows_16 takes them)."""
    xn = np.empty_like(x)
    rms_norm_rows(x, norm_w, eps, xn)
    rows_16(xn, w, kind, out, 0, res, mode)


@njit(**_FLAGS)
def norm_rows_16_parallel(x, norm_w, eps, w, kind, out, res, mode, ctl):
    """norm_rows_16 with the product shared with the worker threads of ctl (workers.py)."""
    xn = np.empty_like(x)
    rms_norm_rows(x, norm_w, eps, xn)
    rows_16_parallel(xn, w, kind, out, 0, res, mode, ctl)


@njit(**_FLAGS)
def ffn_16(x, norm_w, eps, w_gate_up, w_down, kind, out):
    """out = x + down(silu(gate(xn)) * up(xn)), xn = rms_norm(x)."""
    h = np.empty((x.shape[0], w_gate_up.shape[0] // 2), np.float32)
    norm_rows_16(x, norm_w, eps, w_gate_up, kind, h, h, GATE_UP)
    rows_16(h, w_down, kind, out, 0, x, RESIDUAL)


@njit(**_FLAGS)
def ffn_16_parallel(x, norm_w, eps, w_gate_up, w_down, kind, out, ctl):
    h = np.empty((x.shape[0], w_gate_up.shape[0] // 2), np.float32)
    norm_rows_16_parallel(x, norm_w, eps, w_gate_up, kind, h, h, GATE_UP, ctl)
    rows_16_parallel(h, w_down, kind, out, 0, x, RESIDUAL, ctl)


@njit(**_FLAGS)
def embed_16(table, ids, kind, out):
    """out[r] = table[ids[r]] widened to float32 (exact)."""
    for r in range(ids.shape[0]):
        row = table[ids[r]]
        if kind == 1:
            for i in range(row.shape[0]):
                out[r, i] = _f16(row[i])
        else:
            for i in range(row.shape[0]):
                out[r, i] = _bf16(row[i])


def warm_up(parallel: bool) -> None:
    x = np.ones((2, 32), np.float32)
    nw = np.ones(32, np.float32)
    w, wd = np.ones((8, 32), np.uint16), np.ones((32, 4), np.uint16)
    w.flags.writeable = wd.flags.writeable = False  # as CpuOps hands 16-bit weights over (ops._bits16)
    out = np.empty((2, 8), np.float32)
    norm_rows_16(x, nw, np.float32(1e-5), w, 1, out, out, PLAIN)
    ffn_16(x, nw, np.float32(1e-5), w, wd, 1, np.empty_like(x))
    if parallel:
        ctl = np.zeros(CTL_WORDS, np.int64)  # no workers: the calling thread computes every chunk
        norm_rows_16_parallel(x, nw, np.float32(1e-5), w, 1, out, out, PLAIN, ctl)
        ffn_16_parallel(x, nw, np.float32(1e-5), w, wd, 1, np.empty_like(x), ctl)
    embed_16(w, np.zeros(2, np.int64), 1, np.empty((2, 32), np.float32))
