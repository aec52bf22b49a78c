"""Numba kernels of the NumPy backend, for the ops where NumPy's per-call overhead or BLAS's choice of
kernel by row count would dominate or break row invariance.

Each output element's reduction is one compiled loop over the whole of K, the same machine code for
every token row: the rows loop sits outside it, so a row's bits cannot depend on how many rows share
the call. Every caller passes C-contiguous float32 arrays only, so each kernel has one specialisation
(numba compiles another for other layouts, which could vectorise a reduction differently).
`fastmath` lets LLVM split a reduction into vector lanes; the split is fixed at compile time by K.
16-bit weights and KV pages are widened as they are read (LLVM fpext: one vcvtph2ps per vector).
Compiled code is cached on disk (cache=True) and `warm_up` pays for loading it before a request does.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from lockstep_kernels.cpu import matvec
from lockstep_kernels.cpu.expf import exp32
from lockstep_kernels.cpu.workers import CTL_WORDS, split_dots

MATVEC_EPOCH = 6  # numba caches a function keyed on its own file only: bump with matvec.EPOCH, or a stale copy runs
# fastmath without nnan/ninf: attention starts its running max at -inf
_FLAGS = {"cache": True, "fastmath": {"reassoc", "contract", "nsz", "arcp"}, "nogil": True,
          "error_model": "numpy", "boundscheck": False}
_EXACT = {k: v for k, v in _FLAGS.items() if k != "fastmath"}


@njit(inline="always", **_FLAGS)
def _dot(x, w, k):
    acc = np.float32(0.0)
    for i in range(k):
        acc += x[i] * w[i]
    return acc


@intrinsic
def _f16(typingctx, h):
    """f16 bits (uint16) -> float32: LLVM's fpext, a vcvtph2ps in vectorised loops (exact)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _bf16(typingctx, h):
    """bf16 bits (uint16) -> float32: the bits shifted into the high half (exact)."""
    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())
    return types.float32(types.uint16), codegen


@njit(**_FLAGS)
def rows_matvec(x, w, out, n0):
    """out[r, n0 + j] = x[r] . w[j] for every row r: each weight row is read once for all token rows."""
    t, k = x.shape
    for j in range(w.shape[0]):
        wj = w[j]
        for r in range(t):
            out[r, n0 + j] = _dot(x[r], wj, k)


@njit(parallel=True, **_FLAGS)
def rows_matvec_parallel(x, w, out, n0):
    """rows_matvec with the weight rows split across threads: whichever thread computes an output
    runs the same loop over K, so the split cannot change a bit."""
    t, k = x.shape
    n = w.shape[0]
    step = 64
    for c in prange((n + step - 1) // step):
        for j in range(c * step, min(n, c * step + step)):
            wj = w[j]
            for r in range(t):
                out[r, n0 + j] = _dot(x[r], wj, k)


PLAIN, RESIDUAL, GATE_UP = 0, 1, 2  # what rows_16 writes (see there)


@njit(inline="always", **_FLAGS)
def _dot_16(x, w, kind, k):
    """x . w for a 16-bit w, widened as it is read (one vcvtph2ps per vector for f16)."""
    acc = np.float32(0.0)
    if kind == 1:
        for i in range(k):
            acc += x[i] * _f16(w[i])
    else:
        for i in range(k):
            acc += x[i] * _bf16(w[i])
    return acc


@njit(inline="always", **_EXACT)
def _silu_mul(g, u):
    return g / (np.float32(1.0) + exp32(-g)) * u


@njit(**_EXACT)
def silu_mul_rows(y, f, out):
    """y [T, 2F] holds gate | up: out = silu(gate) * up. Without fastmath and with expf.exp32, LLVM's
    vectorised loop gives each element its scalar bits in any caller (libm's expf was a call each)."""
    for r in range(y.shape[0]):
        for i in range(f):
            g = y[r, i]
            out[r, i] = _silu_mul(g, y[r, f + i])


@njit(**_FLAGS)
def _rows_16(x, w, kind, out, n0, res, mode, j0, j1):
    t, k = x.shape
    if k % matvec.BLOCK == 0:  # the vector kernel, its reduction order written out (matvec.py)
        matvec.blocked_rows_16(x, w, kind, out, 0 if mode == RESIDUAL else n0, res, mode == RESIDUAL, j0, j1)
        return
    for j in range(j0, j1):
        wj = w[j]
        if mode == RESIDUAL:
            for r in range(t):
                out[r, j] = res[r, j] + _dot_16(x[r], wj, kind, k)
        else:
            for r in range(t):
                out[r, n0 + j] = _dot_16(x[r], wj, kind, k)


@njit(**_FLAGS)
def rows_16(x, w, kind, out, n0, res, mode):
    """The row kernel over a 16-bit weight w [N, K] (kind 1 f16, 2 bf16, as uint16), widened as it is
    read (half the bytes of a float32 copy); each weight row is read once for all token rows. PLAIN:
    out[r, n0 + j] = x[r] . w[j]; RESIDUAL: out[r, j] = res[r, j] + x[r] . w[j]; GATE_UP (w = gate |
    up, N = 2F): out [T, F] = silu_mul_rows of the PLAIN product."""
    if mode == GATE_UP:
        y = np.empty((x.shape[0], w.shape[0]), np.float32)
        _rows_16(x, w, kind, y, 0, y, PLAIN, 0, w.shape[0])
        silu_mul_rows(y, w.shape[0] // 2, out)
    else:
        _rows_16(x, w, kind, out, n0, res, mode, 0, w.shape[0])


@njit(**_FLAGS)
def rows_16_parallel(x, w, kind, out, n0, res, mode, ctl):
    """rows_16 with the weight rows shared with the worker threads of ctl (workers.py): whichever thread
    computes an output runs the same loops, so the split cannot change a bit. K outside the vector
    kernel (matvec.BLOCK) runs on the calling thread alone."""
    t, k = x.shape
    if k % matvec.BLOCK:
        rows_16(x, w, kind, out, n0, res, mode)
        return
    n = w.shape[0]
    y = np.empty((t, n), np.float32) if mode == GATE_UP else out
    at = n0 if mode == PLAIN else 0
    split_dots(ctl, x.ctypes.data, t, k, w.ctypes.data, kind, y.ctypes.data + at * 4, y.shape[1], res.ctypes.data,
               mode == RESIDUAL, n)
    if mode == GATE_UP:
        silu_mul_rows(y, n // 2, out)


@njit(**_FLAGS)
def rms_norm_rows(x, weight, eps, out):
    t, d = x.shape
    for r in range(t):
        xr = x[r]
        ss = np.float32(0.0)
        for i in range(d):
            ss += xr[i] * xr[i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(d) + eps)
        for i in range(d):
            out[r, i] = (xr[i] * inv) * weight[i]


def usable_threads(n: int) -> int:
    """At most the pool numba started with (NUMBA_NUM_THREADS, fixed once numba is imported)."""
    return max(1, min(n, numba.config.NUMBA_NUM_THREADS))


def in_threads(n: int, kernel, *args) -> None:
    """Runs a parallel kernel over n threads. numba's thread count is per calling thread, and the
    engine computes on its own thread, so it is set where the kernel is called."""
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    kernel(*args)


def warm_up(parallel: bool) -> None:
    """Compiles (first run) or loads (later runs) every kernel for each signature it is called with:
    weights come writable or read-only (memory-mapped files), a distinct type to numba. The threaded
    kernels only with `parallel` (one thread never calls them, and they take longest to compile)."""
    x = np.ones((2, 32), np.float32)
    out = np.empty((2, 8), np.float32)
    w16 = np.ones((4, 32), np.uint16)
    w16.flags.writeable = False  # as CpuOps hands 16-bit weights over (ops._bits16)
    rows_16(x, w16, 1, out, 0, out, GATE_UP)
    if parallel:
        rows_16_parallel(x, w16, 1, out, 0, out, GATE_UP, np.zeros(CTL_WORDS, np.int64))
    for writable in (True, False):
        w = np.ones((4, 32), np.float32)
        w.flags.writeable = writable
        rows_matvec(x, w, out, 4)
        if parallel:
            rows_matvec_parallel(x, w, out, 4)
    rms_norm_rows(x, x[0].copy(), np.float32(1e-5), x.copy())
    silu_mul_rows(x, 16, x[:, :16].copy())
