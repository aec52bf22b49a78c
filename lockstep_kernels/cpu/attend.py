"""Paged attention of the NumPy backend, compiled (numba).

A query row at position p attends to keys 0..p in page-size chunks in logical order; each chunk is
reduced in one fixed order and the chunks are merged in ascending order, so a row's bits depend on
its own query and keys only (not on the other rows of the call, nor on where its pages sit).
A chunk's keys and values are widened to float32 once, into scratch, before the dot products:
the reductions then run over contiguous float32 rows whatever the KV cache stores.

No fastmath here: every addition and fused multiply-add is in the order the code writes (a score's
dot product in LANES partial sums by explicit vector IR, as matvec.py does), so a row's bits are the
same in every function this code is compiled into: the calling thread's and a worker's (jobs.py).
With reassociation allowed, LLVM vectorised the same loops differently in different callers.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from lockstep_kernels.cpu.compiled import _bf16, _f16
from lockstep_kernels.cpu.expf import exp32
from lockstep_kernels.cpu.expf import fma as _fma
from lockstep_kernels.cpu.matvec import LANES, fma_loop, halve

# jobs.py and layer.py hold numba-cached copies of this file's functions (and of expf.py's); numba checks only a function's
# own file, so a change here bumps EPOCH and their ATTEND_EPOCH (tests check them)
EPOCH = 5
_FLAGS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)


@intrinsic
def _dot_lanes(typingctx, x_addr, w_addr, n):
    """x . w over n float32 (n a positive multiple of LANES, by address): element i into partial sum
    i % LANES by fused multiply-adds in ascending i, then the lanes halved in a fixed tree."""
    def codegen(context, builder, sig, args):
        xa, wa, n = args
        xp = builder.inttoptr(xa, _F32.as_pointer())
        wp = builder.inttoptr(wa, _F32.as_pointer())

        def body(i, fma, accs):
            xv = builder.load(builder.bitcast(builder.gep(xp, [i]), _VF.as_pointer()), align=4)
            wv = builder.load(builder.bitcast(builder.gep(wp, [i]), _VF.as_pointer()), align=4)
            return [builder.call(fma, [xv, wv, accs[0]])]

        return halve(builder, fma_loop(builder, 1, LANES, n, body)[0])
    return types.float32(types.uintp, types.uintp, types.intp), codegen


@njit(inline="always", **_FLAGS)
def _dot(x, w, n):
    """x . w for two contiguous float32 rows: _dot_lanes, or one chain in ascending order for other n."""
    if n % LANES == 0:
        return _dot_lanes(x.ctypes.data, w.ctypes.data, n)
    acc = np.float32(0.0)
    for i in range(n):
        acc = _fma(x[i], w[i], acc)
    return acc


@njit(inline="always", **_FLAGS)
def _widen_page(src, kind, n, dst, h0, h1):
    """Rows 0..n, heads h0..h1 of one KV page [page_size, kv, hd] into dst [>= n, kv, hd] as float32."""
    hd = src.shape[2]
    for p in range(n):
        for h in range(h0, h1):
            if kind == 0:
                for i in range(hd):
                    dst[p, h, i] = src[p, h, i]
            elif kind == 1:
                for i in range(hd):
                    dst[p, h, i] = _f16(src[p, h, i])
            else:
                for i in range(hd):
                    dst[p, h, i] = _bf16(src[p, h, i])


@njit(inline="always", **_FLAGS)
def _chunk(q, k, v, n, s, m, lsum, out, h0, h1):
    """One query row q [kv, group, hd] (scaled), its KV heads h0..h1, over the chunk's n float32 keys and
    values k, v [>= n, kv, hd]: the unnormalised sum of values into out [kv, group, hd], the score max
    and exp-sum per [kv, group] into m and lsum. s: scratch [group, >= n]."""
    group, hd = q.shape[1], q.shape[2]
    for h in range(h0, h1):
        for g in range(group):
            qg = q[h, g]
            for p in range(n):
                s[g, p] = _dot(k[p, h], qg, hd)
        for g in range(group):
            mx = np.float32(-np.inf)
            for p in range(n):
                mx = max(mx, s[g, p])
            for p in range(n):  # elementwise: LLVM may vectorise it, which cannot change a bit
                s[g, p] = exp32(s[g, p] - mx)
            tot = np.float32(0.0)
            for p in range(n):
                tot += s[g, p]
            m[h, g] = mx
            lsum[h, g] = tot
            out[h, g] = 0.0
        for g in range(group):
            o = out[h, g]
            for p in range(n):
                e = s[g, p]
                vp = v[p, h]
                for i in range(hd):
                    o[i] = _fma(e, vp[i], o[i])


@njit(**_FLAGS)
def attend_chunk(q, k, v, kind, out):
    """One query row q [kv, group, hd] (scaled) over the keys of one chunk, k and v [n, kv, hd]
    float32 (kind 0) or 16-bit (kind 1 f16, 2 bf16, as uint16): the unnormalised sum of values into
    out; returns the score max and exp-sum per [kv, group] (the caller merges chunks in ascending order)."""
    n = k.shape[0]
    kw = np.empty(k.shape, np.float32)
    vw = np.empty(v.shape, np.float32)
    _widen_page(k, kind, n, kw, 0, q.shape[0])
    _widen_page(v, kind, n, vw, 0, q.shape[0])
    m = np.empty(q.shape[:2], np.float32)
    lsum = np.empty(q.shape[:2], np.float32)
    _chunk(q, kw, vw, n, np.empty((q.shape[1], n), np.float32), m, lsum, out, 0, q.shape[0])
    return m, lsum


@njit(inline="always", **_FLAGS)
def _attend_row(q, k_pages, v_pages, kind, pos, table, page_size, acc, h, kw, vw, s, m, lsum, m_c, l_c, o_c):
    """One query row q [kv, group, hd], its KV head h, over keys 0..pos of its page table into acc; the
    rest is scratch."""
    group, hd = q.shape[1], q.shape[2]
    last = pos // page_size
    for c in range(last + 1):
        n = page_size if c < last else pos % page_size + 1
        _widen_page(k_pages[table[c]], kind, n, kw, h, h + 1)
        _widen_page(v_pages[table[c]], kind, n, vw, h, h + 1)
        if c == 0:
            _chunk(q, kw, vw, n, s, m, lsum, acc, h, h + 1)
            continue
        _chunk(q, kw, vw, n, s, m_c, l_c, o_c, h, h + 1)
        for g in range(group):
            m_new = max(m[h, g], m_c[h, g])
            a, b = np.exp(m[h, g] - m_new), np.exp(m_c[h, g] - m_new)
            lsum[h, g] = lsum[h, g] * a + l_c[h, g] * b
            for i in range(hd):
                acc[h, g, i] = acc[h, g, i] * a + o_c[h, g, i] * b
            m[h, g] = m_new
    for g in range(group):
        for i in range(hd):
            acc[h, g, i] = acc[h, g, i] / lsum[h, g]


def attend_rows(q, k_pages, v_pages, kind, positions, seqs, tables, page_size, out) -> None:
    """Every query row over keys 0..its position, in page-size chunks in logical order, the chunks merged
    in ascending order (the page table gives each chunk's physical page, so placement cannot matter).
    q, out [T, kv, group, hd]; k_pages, v_pages [pages, page_size, kv, hd] as attend_chunk takes them.
    (From Python: a literal 0 from compiled code would make numba compile attend_range once more.)"""
    attend_range(q, k_pages, v_pages, kind, positions, seqs, tables, page_size, out, 0, q.shape[0] * q.shape[1])


@njit(**_FLAGS)
def attend_range(q, k_pages, v_pages, kind, positions, seqs, tables, page_size, out, c0, c1):
    """attend_rows over tasks c0..c1 only, task c = row c // kv, KV head c % kv: a task's arithmetic is
    the same whichever tasks share the call (the worker threads take tasks this way: lockstep_kernels/cpu/jobs.py)."""
    n_kv, group, hd = q.shape[1:]
    kw = np.empty((page_size, n_kv, hd), np.float32)
    vw = np.empty((page_size, n_kv, hd), np.float32)
    s = np.empty((group, page_size), np.float32)
    m = np.empty((n_kv, group), np.float32)
    lsum = np.empty((n_kv, group), np.float32)
    m_c = np.empty((n_kv, group), np.float32)
    l_c = np.empty((n_kv, group), np.float32)
    o_c = np.empty((n_kv, group, hd), np.float32)
    for c in range(c0, c1):
        r, h = c // n_kv, c % n_kv
        _attend_row(q[r], k_pages, v_pages, kind, positions[r], tables[seqs[r]], page_size, out[r], h, kw, vw, s,
                    m, lsum, m_c, l_c, o_c)


def warm_up() -> None:
    q = np.ones((2, 2, 32), np.float32)
    rows, table = np.zeros(2, np.int64), np.zeros((1, 1), np.int64)
    for kv in (np.ones((1, 4, 2, 32), np.float32), np.ones((1, 4, 2, 32), np.uint16)):
        kind = 0 if kv.dtype == np.float32 else 1
        attend_rows(q[None].repeat(2, 0), kv, kv, kind, rows, rows, table, 4, np.empty((2, *q.shape), np.float32))
    kv = np.ones((4, 2, 32), np.float32)
    attend_chunk(q, kv, kv, 0, np.empty_like(q))
