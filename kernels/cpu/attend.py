"""Paged attention of the NumPy backend, compiled (numba).

A query row at position p attends to keys 0..p in page-size chunks in logical order; each chunk is
reduced in one fixed order and the chunks are merged in ascending order, so a row's bits depend on
its own query and keys only (not on the other rows of the call, nor on where its pages sit).
A chunk's keys and values are widened to float32 once, into scratch, before the dot products:
the reductions then run over contiguous float32 rows whatever the KV cache stores.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kernels.cpu.compiled import _FLAGS, _bf16, _dot, _f16


@njit(inline="always", **_FLAGS)
def _widen_page(src, kind, n, dst):
    """Rows 0..n of one KV page [page_size, kv, hd] into dst [>= n, kv, hd] as float32."""
    n_kv, hd = src.shape[1], src.shape[2]
    for p in range(n):
        for h in range(n_kv):
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
def _chunk(q, k, v, n, s, m, lsum, out):
    """One query row q [kv, group, hd] (scaled) over the chunk's n float32 keys and values k, v
    [>= n, kv, hd]: the unnormalised sum of values into out [kv, group, hd], the score max and
    exp-sum per [kv, group] into m and lsum. s: scratch [group, >= n]."""
    n_kv, group, hd = q.shape
    for h in range(n_kv):
        for g in range(group):
            qg = q[h, g]
            for p in range(n):
                s[g, p] = _dot(k[p, h], qg, hd)
        for g in range(group):
            mx = np.float32(-np.inf)
            for p in range(n):
                mx = max(mx, s[g, p])
            tot = np.float32(0.0)
            for p in range(n):
                e = np.exp(s[g, p] - mx)
                s[g, p] = e
                tot += e
            m[h, g] = mx
            lsum[h, g] = tot
            out[h, g] = 0.0
        for g in range(group):
            o = out[h, g]
            for p in range(n):
                e = s[g, p]
                vp = v[p, h]
                for i in range(hd):
                    o[i] += e * vp[i]


@njit(**_FLAGS)
def attend_chunk(q, k, v, kind, out):
    """One query row q [kv, group, hd] (scaled) over the keys of one chunk, k and v [n, kv, hd]
    float32 (kind 0) or 16-bit (kind 1 f16, 2 bf16, as uint16): the unnormalised sum of values into
    out; returns the score max and exp-sum per [kv, group] (the caller merges chunks in ascending order)."""
    n = k.shape[0]
    kw = np.empty(k.shape, np.float32)
    vw = np.empty(v.shape, np.float32)
    _widen_page(k, kind, n, kw)
    _widen_page(v, kind, n, vw)
    m = np.empty(q.shape[:2], np.float32)
    lsum = np.empty(q.shape[:2], np.float32)
    _chunk(q, kw, vw, n, np.empty((q.shape[1], n), np.float32), m, lsum, out)
    return m, lsum


@njit(**_FLAGS)
def attend_rows(q, k_pages, v_pages, kind, positions, seqs, tables, page_size, out):
    """Every query row over keys 0..its position, in page-size chunks in logical order, the chunks merged
    in ascending order (the page table gives each chunk's physical page, so placement cannot matter).
    q, out [T, kv, group, hd]; k_pages, v_pages [pages, page_size, kv, hd] as attend_chunk takes them."""
    n_kv, group, hd = q.shape[1:]
    kw = np.empty((page_size, n_kv, hd), np.float32)
    vw = np.empty((page_size, n_kv, hd), np.float32)
    s = np.empty((group, page_size), np.float32)
    m = np.empty((n_kv, group), np.float32)
    lsum = np.empty((n_kv, group), np.float32)
    m_c = np.empty((n_kv, group), np.float32)
    l_c = np.empty((n_kv, group), np.float32)
    o_c = np.empty((n_kv, group, hd), np.float32)
    for r in range(q.shape[0]):
        pos = positions[r]
        table = tables[seqs[r]]
        last = pos // page_size
        acc = out[r]
        for c in range(last + 1):
            n = page_size if c < last else pos % page_size + 1
            _widen_page(k_pages[table[c]], kind, n, kw)
            _widen_page(v_pages[table[c]], kind, n, vw)
            if c == 0:
                _chunk(q[r], kw, vw, n, s, m, lsum, acc)
                continue
            _chunk(q[r], kw, vw, n, s, m_c, l_c, o_c)
            for h in range(n_kv):
                for g in range(group):
                    m_new = max(m[h, g], m_c[h, g])
                    a, b = np.exp(m[h, g] - m_new), np.exp(m_c[h, g] - m_new)
                    lsum[h, g] = lsum[h, g] * a + l_c[h, g] * b
                    for i in range(hd):
                        acc[h, g, i] = acc[h, g, i] * a + o_c[h, g, i] * b
                    m[h, g] = m_new
        for h in range(n_kv):
            for g in range(group):
                for i in range(hd):
                    acc[h, g, i] = acc[h, g, i] / lsum[h, g]


def warm_up() -> None:
    q = np.ones((2, 2, 32), np.float32)
    rows, table = np.zeros(2, np.int64), np.zeros((1, 1), np.int64)
    for kv in (np.ones((1, 4, 2, 32), np.float32), np.ones((1, 4, 2, 32), np.uint16)):
        kind = 0 if kv.dtype == np.float32 else 1
        attend_rows(q[None].repeat(2, 0), kv, kv, kind, rows, rows, table, 4, np.empty((2, *q.shape), np.float32))
    kv = np.ones((4, 2, 32), np.float32)
    attend_chunk(q, kv, kv, 0, np.empty_like(q))
